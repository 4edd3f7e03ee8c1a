/* Native file access the in-process monitor cannot see: `open` is found at run time in the C library's own
   dynamic symbol table (the library's ELF header is found by stepping back, page by page, from the address of
   strlen, an allowed symbol), so the built library needs no undefined symbol beyond the allow-list and no system
   call instruction of its own. The paths are filled in by the test (tests/integrity/test_integrity_cpu.py). */
#include <elf.h>
#include <stdint.h>
#include <string.h>

typedef int (*open_fn)(const char*, int, ...);
typedef int (*close_fn)(int);

static const char* OWN = "model_new.py";        /* the solution's own file: must open (the probe works) */
static const char* PRIVATE[] = {
    "model.py",                                 /* the workspace's copy of the reference */
    "@PRISTINE@",                               /* the task's pristine reference, in the repository */
    "@CACHE@",                                  /* the build cache (every job's builds) */
    "@OTHER_WS@",                               /* another job's workspace */
};

static void* libc_symbol(const char* want) {
    uintptr_t page = (uintptr_t)(void*)&strlen & ~(uintptr_t)4095;
    while (memcmp((const void*)page, ELFMAG, SELFMAG) != 0) page -= 4096;
    const Elf64_Ehdr* hdr = (const Elf64_Ehdr*)page;
    const Elf64_Phdr* seg = (const Elf64_Phdr*)(page + hdr->e_phoff);
    const Elf64_Dyn* d = 0;
    for (int k = 0; k < hdr->e_phnum; ++k)
        if (seg[k].p_type == PT_DYNAMIC) d = (const Elf64_Dyn*)(page + seg[k].p_vaddr);
    const Elf64_Sym* syms = 0;
    const char* names = 0;
    for (; d && d->d_tag != DT_NULL; ++d) {
        uintptr_t v = d->d_un.d_ptr < page ? page + d->d_un.d_ptr : d->d_un.d_ptr;
        if (d->d_tag == DT_SYMTAB) syms = (const Elf64_Sym*)v;
        if (d->d_tag == DT_STRTAB) names = (const char*)v;
    }
    if (!syms || !names) return 0;
    for (const Elf64_Sym* s = syms + 1; (const char*)s < names; ++s)  /* .dynsym lies right before .dynstr */
        if (ELF64_ST_TYPE(s->st_info) == STT_FUNC && s->st_value && strcmp(names + s->st_name, want) == 0)
            return (void*)(page + s->st_value);
    return 0;
}

/* out = y when the own file opened and none of the private ones did; else every element is 1000 + a bit mask
   (bit 0: the own file did not open or `open` was not found; bit k+1: PRIVATE[k] opened), which the result's
   error message shows. */
void native_open_private(const float* y, float* out, long long n) {
    open_fn op = (open_fn)libc_symbol("open");
    close_fn cl = (close_fn)libc_symbol("close");
    int mask = 0;
    if (!op || !cl) {
        mask = 1;
    } else {
        int fd = op(OWN, 0);
        if (fd < 0) mask |= 1; else cl(fd);
        for (int k = 0; k < (int)(sizeof PRIVATE / sizeof PRIVATE[0]); ++k) {
            fd = op(PRIVATE[k], 0);
            if (fd >= 0) { mask |= 2 << k; cl(fd); }
        }
    }
    for (long long i = 0; i < n; ++i) out[i] = mask ? 1000.0f + (float)mask : y[i];
}
