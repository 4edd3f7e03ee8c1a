/* adversarial_native.h: what the adversarial native solutions of this folder share (integrity_lib.adversarial
   copies it into kernels/ beside the solution that includes it).
   - resolve(name): a libc function's address, found from libc's in-memory ELF (walk back from memcmp's page to the
     ELF header, then PT_DYNAMIC -> DT_SYMTAB / DT_STRTAB), so the solution has no undefined symbol outside the
     sandbox's allow-list and no syscall instruction of its own;
   - chain(x, y, lo, hi): the base solution's honest elementwise_chain kernel (integrity_lib.adversarial puts it in
     kernels/) on elements [lo, hi), the work each attack does for real so that its outputs are correct. */
#ifndef ADVERSARIAL_NATIVE_H
#define ADVERSARIAL_NATIVE_H
#include <elf.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

static void* resolve(const char* name) {
    uintptr_t p = (uintptr_t)(void*)&memcmp & ~(uintptr_t)0xfff;
    while (memcmp((const void*)p, "\177ELF", 4) != 0) p -= 0x1000;
    const Elf64_Ehdr* eh = (const Elf64_Ehdr*)p;
    const Elf64_Phdr* ph = (const Elf64_Phdr*)(p + eh->e_phoff);
    const Elf64_Dyn* dyn = 0;
    for (int i = 0; i < eh->e_phnum; ++i)
        if (ph[i].p_type == PT_DYNAMIC) dyn = (const Elf64_Dyn*)(p + ph[i].p_vaddr);
    if (!dyn) return 0;
    uintptr_t symtab = 0, strtab = 0;
    for (; dyn->d_tag != DT_NULL; ++dyn) {
        if (dyn->d_tag == DT_SYMTAB) symtab = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRTAB) strtab = dyn->d_un.d_ptr;
    }
    if (symtab < p) symtab += p;
    if (strtab < p) strtab += p;
    for (const Elf64_Sym* s = (const Elf64_Sym*)symtab + 1; (uintptr_t)s < strtab; ++s)
        if (s->st_name && s->st_value && strcmp((const char*)(strtab + s->st_name), name) == 0)
            return (void*)(p + s->st_value);
    return 0;
}

/* the corpus's honest kernel (kernels/elementwise_chain.cpp of the base solution), on elements [lo, hi) */
void elementwise_chain(const float* x, float* y, long long n);
static void chain(const float* x, float* y, long long lo, long long hi) { elementwise_chain(x + lo, y + lo, hi - lo); }
#endif
