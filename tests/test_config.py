import dataclasses

import pytest

from cuda_agent.config import ConfigError, load_config, to_yaml


@dataclasses.dataclass
class _Inner:
    timeout_s: float = 1.0


@dataclasses.dataclass
class _Cfg:
    name: str = "a"
    workers: int = 2
    inner: _Inner = dataclasses.field(default_factory=_Inner)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


def test_layers_merge_in_order(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("workers: 4\ninner:\n  timeout_s: 3.5\n")
    cfg = load_config(_Cfg, p, ["name=b", "inner.timeout_s=7"])
    assert isinstance(cfg, _Cfg) and isinstance(cfg.inner, _Inner)
    assert (cfg.name, cfg.workers, cfg.inner.timeout_s) == ("b", 4, 7.0)
    assert "timeout_s: 7.0" in to_yaml(cfg)


def test_unknown_key_and_bad_type_are_named(tmp_path):
    with pytest.raises(ConfigError, match="nope"):
        load_config(_Cfg, None, ["nope=1"])
    with pytest.raises(ConfigError, match="workers"):
        load_config(_Cfg, None, ["workers=many"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(_Cfg, None, ["workers"])


def test_validation_runs():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        load_config(_Cfg, None, ["workers=0"])


def test_missing_and_malformed_files_and_the_override_at_fault_are_named(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(_Cfg, tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml: not readable as YAML"):
        load_config(_Cfg, bad)
    good = tmp_path / "good.yaml"
    good.write_text("workers: 3\n")
    with pytest.raises(ConfigError, match="bad override 'nope=1'") as e:
        load_config(_Cfg, good, ["name=x", "nope=1"])
    assert "good.yaml" not in str(e.value)  # the file is fine: the override is blamed, not the preset


def test_a_config_path_with_an_equals_sign_is_a_path_not_an_override(tmp_path):
    """`cuda-agent sandbox serve RUN/x=y/sandbox.yaml key=value`: a run folder may hold "=" in its name."""
    from cuda_agent.config import config_path_and_overrides

    odd = tmp_path / "agent.verify_on_finish=true" / "sandbox.yaml"
    odd.parent.mkdir()
    odd.write_text("workers: 3\n")
    assert config_path_and_overrides([str(odd), "name=x"]) == (str(odd), ["name=x"])
    assert config_path_and_overrides(["workers=2", "name=x"]) == (None, ["workers=2", "name=x"])
    assert config_path_and_overrides(["plain.yaml"]) == ("plain.yaml", [])
    assert config_path_and_overrides([]) == (None, [])
    path, items = config_path_and_overrides([str(odd), "name=x"])
    assert load_config(_Cfg, path, items).workers == 3
    # an override stays an override even where a file of that name exists; a long one is no file name
    (tmp_path / "workers=4").write_text("workers: 9\n")
    assert config_path_and_overrides(["workers=4"]) == (None, ["workers=4"])
    assert config_path_and_overrides(["name=" + "x" * 400]) == (None, ["name=" + "x" * 400])
    # a missing path that holds "=" is reported as a missing file, not as a bad override
    path, items = config_path_and_overrides([str(tmp_path / "run/lr=1e-3/sandbx.yaml")])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(_Cfg, path, items)


@pytest.mark.parametrize("name", ["local", "smoke", "h200", "multihost"])
def test_every_train_preset_loads_and_validates(name):
    """Each preset `cuda-agent train --preset NAME` offers loads into TrainConfig with its validation (a preset a
    person can only try on the GPU host, h200, is checked here too); h200 is the GPU preset."""
    from cuda_agent.train import OTHER_PRESETS, PRESETS_DIR, preset_path
    from cuda_agent.train_config import TrainConfig

    shipped = {p.stem for p in PRESETS_DIR.glob("*.yaml")} - set(OTHER_PRESETS)
    assert shipped == {"local", "smoke", "h200", "multihost"}, f"presets changed: {sorted(shipped)}: update this test"
    cfg = load_config(TrainConfig, preset_path(name), [f"preset={name}"])
    assert cfg.preset == name
    if name == "h200":
        assert cfg.device == "cuda" and cfg.tasks.format == "cubin"


def test_model_remat_policy_is_validated_and_reaches_the_model_config():
    from cuda_agent.prepare import model_config
    from cuda_agent.train_config import ModelSpec

    with pytest.raises(ValueError, match=r"model.remat_policy must be one of \('full', 'save_dots'\)"):
        ModelSpec(remat_policy="dots")
    cfg = model_config(ModelSpec(remat=True, remat_policy="save_dots"), vocab_size=500)
    assert (cfg.remat, cfg.remat_policy, cfg.vocab_size) == (True, "save_dots", 512)


def test_warm_start_microbatch_rows_is_validated():
    from cuda_agent.train_config import TrainConfig

    with pytest.raises(ValueError, match=r"stages.warm_start.microbatch_rows must be >= 0, got -1"):
        load_config(TrainConfig, None, ["stages.warm_start.microbatch_rows=-1"])
    cfg = load_config(TrainConfig, None, ["stages.warm_start.microbatch_rows=2"])
    assert cfg.stages.warm_start.microbatch_rows == 2


def test_microbatch_rows_divides_the_step():
    from cuda_agent.stage_worker import microbatch_rows

    assert [microbatch_rows(r, 4) for r in (0, 1, 2, 3, 4, 9)] == [4, 1, 2, 2, 4, 4]
    assert microbatch_rows(4, 6) == 3 and microbatch_rows(0, 1) == 1
