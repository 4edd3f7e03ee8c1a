"""Bad checkpoints give errors that name the file and what is wrong; import holds one copy of the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from learner.hf_checkpoint import CheckpointError, SafetensorsFile, load_pretrained, read_config, save_pretrained
from learner.model import ModelConfig, Transformer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sharded(tmp_path):
    model = Transformer(ModelConfig.tiny(), nnx.Rngs(0))
    save_pretrained(model, tmp_path, dtype="float32", max_shard_bytes=60_000)
    return tmp_path


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_pretrained(tmp_path)


def test_unknown_architecture(sharded):
    cfg = json.loads((sharded / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (sharded / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: unknown architecture \['MambaForCausalLM'\]"):
        read_config(sharded)


def test_unsupported_rope_type_names_file(sharded):
    cfg = json.loads((sharded / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "longrope", "factor": 2.0}
    (sharded / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: .*longrope"):
        read_config(sharded)


def test_missing_shard_file(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (sharded / victim).unlink()
    with pytest.raises(CheckpointError, match=f"{victim}: missing shard named by .*index.json"):
        load_pretrained(sharded)


def test_missing_tensor(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"index\.json: tensor 'model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        load_pretrained(sharded)


def test_shape_mismatch_names_shard_and_tensor(sharded):
    cfg = json.loads((sharded / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the files hold 128
    (sharded / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model-\d+-of-\d+\.safetensors: tensor '.*mlp\..*' has shape"):
        load_pretrained(sharded)


def test_truncated_safetensors(tmp_path):
    model = Transformer(ModelConfig.tiny(), nnx.Rngs(0))
    save_pretrained(model, tmp_path, dtype="float32")
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor .* run past the end"):
        load_pretrained(tmp_path)


def test_no_weights(tmp_path):
    model = Transformer(ModelConfig.tiny(), nnx.Rngs(0))
    save_pretrained(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors file"):
        load_pretrained(tmp_path)


def test_reader_agrees_with_safetensors_library(tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 5)).astype(np.float32),
               "b": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
               "c": np.zeros((0, 4), np.float32), "d": np.arange(6, dtype=np.int64).reshape(2, 3)}
    save_file(tensors, str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for name, value in tensors.items():
        got = f.read(name)
        assert got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got.astype(np.float64), value.astype(np.float64))


_MEASURE = textwrap.dedent("""
    import json, sys
    import jax
    from flax import nnx
    from learner.hf_checkpoint import load_pretrained, read_config
    from learner.model import Transformer

    def status_kib(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])

    cfg = read_config(sys.argv[1])
    # warm the code paths on a throwaway abstract model so that their one-off allocations are in the baseline
    nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))
    jax.device_put(jax.numpy.zeros(8)).block_until_ready()
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
        f.write("5")
    before = status_kib("VmRSS")
    model = load_pretrained(sys.argv[1])
    jax.block_until_ready(nnx.state(model))
    print(json.dumps({"model": sum(x.nbytes for x in jax.tree.leaves(nnx.state(model))), "before_kib": before, "peak_kib": status_kib("VmHWM"), "after_kib": status_kib("VmRSS")}))
""")


@pytest.mark.parametrize("max_shard_bytes", [2**40, 40 * 2**20], ids=["single", "sharded"])
def test_import_peak_host_memory_is_one_copy(tmp_path, max_shard_bytes):
    """Peak RSS growth during import stays well under two copies of the model (tensor-by-tensor reads)."""
    cfg = ModelConfig(vocab_size=16384, hidden_size=1024, num_layers=4, num_heads=8, num_kv_heads=8,
                      head_dim=128, intermediate_size=2816, tie_embeddings=False, param_dtype="float32")
    model_bytes = cfg.num_params() * 4
    assert model_bytes > 300e6
    import jax

    model = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0)))
    # Cheap weights: constant per parameter (the reader does not care about the values).
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            shape, dtype = var.get_value().shape, var.get_value().dtype
            var.set_value(jax.numpy.full(shape, 0.01, dtype))
    save_pretrained(model, tmp_path, dtype="float32", max_shard_bytes=max_shard_bytes)
    del model
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    growth = (rec["peak_kib"] - rec["before_kib"]) * 1024
    assert (rec["after_kib"] - rec["before_kib"]) * 1024 > 0.8 * model_bytes, rec  # the model itself is there
    assert growth < 1.45 * model_bytes, f"peak host growth {growth / 1e6:.0f} MB for a {model_bytes / 1e6:.0f} MB model"
