"""ReDrafter drafters: the tiny factory in every key spelling, the reader and its one-line mismatches, `inspect`, and
`convert --redrafter` into the TensorRT-LLM checkpoint examples/redrafter/convert_checkpoint.py writes (names,
shapes, config fields per TensorRT-LLM version, TP shards, the drafter tensors equal to the source's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from click.testing import CliRunner

from trtspec import ConvertOptions, convert, read_trtllm_checkpoint
from trtspec.checkpoint.hf_config import read_base_config
from trtspec.checkpoint.redrafter import read_redrafter_drafter, redrafter_mismatches
from trtspec.checkpoint.summary import inspect_checkpoint
from trtspec.checkpoint.tensorfile import open_tensor_file
from trtspec.cli import cli
from trtspec.errors import CheckpointError, ConfigError
from trtspec.testing import TinyModel, write_hf_base, write_redrafter_drafter
from trtspec.testing.factory import REDRAFTER_SPELLINGS, REDRAFTER_STORAGES, redrafter_source_keys

M = TinyModel()  # hidden 64, vocab 256
H, V = M.hidden_size, M.vocab_size
SPELLINGS = tuple(REDRAFTER_SPELLINGS)
STORAGES = tuple(REDRAFTER_STORAGES)
# the drafter shapes: exit_dim = 2 x hidden (no input_proj) or not, recurrent or not
SHAPES = [pytest.param(None, True, id="exit2h-rnn"), pytest.param(96, True, id="exit96-rnn"),
          pytest.param(None, False, id="exit2h-nornn"), pytest.param(96, False, id="exit96-nornn")]

# TensorRT-LLM ReDrafter tensor → shape, written out from tensorrt_llm/models/redrafter/drafter.py (ColumnLinear
# out_features split over tp; lm_head over the padded vocabulary), independently of the converter's tables
def expected_drafter_shapes(*, exit_dim: int, num_layers: int, rnn: bool, vocab: int = V, tp: int = 1) -> dict:
    out = {}
    if exit_dim != 2 * H:
        out |= {"drafter.input_proj.weight": (exit_dim // tp, 2 * H), "drafter.input_proj.bias": (exit_dim // tp,)}
    for i in range(num_layers):
        out |= {f"drafter.layers.{i}.linear.weight": (exit_dim // tp, exit_dim),
                f"drafter.layers.{i}.linear.bias": (exit_dim // tp,)}
    out["drafter.lm_head.weight"] = (-(-vocab // tp), exit_dim)
    if rnn:
        out |= {"drafter.rnn_u.weight": (H // tp, H), "drafter.rnn_u.bias": (H // tp,),
                "drafter.rnn_w.weight": (H // tp, H)}
    return out


def _state(directory: Path) -> dict[str, torch.Tensor]:
    f = open_tensor_file(next(directory / n for n in REDRAFTER_STORAGES.values() if (directory / n).is_file()))
    return {k: f.load(k) for k in f.infos}


def _convert(tmp: Path, base: Path, drafter: Path, name: str = "out", **kwargs) -> Path:
    out = tmp / name
    convert(ConvertOptions(base=base, out=out, redrafter=drafter, **kwargs), show_progress=False)
    return out


def _rank(out: Path, rank: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(out / f"rank{rank}.safetensors")  # the official reader


# ---- the factory ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("exit_dim,rnn", SHAPES)
def test_factory_writes_each_spelling_and_storage(tmp_path, spelling, storage, exit_dim, rnn):
    d = write_redrafter_drafter(tmp_path / "d", M, spelling=spelling, storage=storage, rnn=rnn, exit_dim=exit_dim)
    e = exit_dim or 2 * H
    assert sorted(p.name for p in d.iterdir()) == ["config.json", REDRAFTER_STORAGES[storage]]
    state = _state(d)
    keys = redrafter_source_keys(spelling, exit_dim_is_twice_hidden=e == 2 * H, num_draft_layers=2, rnn=rnn)
    assert sorted(state) == sorted(keys.values())
    expected = expected_drafter_shapes(exit_dim=e, num_layers=2, rnn=rnn)
    assert {k: tuple(state[k].shape) for k in state} == {keys[n]: s for n, s in expected.items()}
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "recurrent_drafting_drafter" and config["architectures"] == ["Drafter"]
    assert (config["hidden_size"], config["exit_dim"], config["num_draft_layers"], config["rnn"],
            config["vocab_size"]) == (H, e, 2, rnn, V)


def test_factory_values_do_not_depend_on_spelling_or_storage(tmp_path):
    ref = _state(write_redrafter_drafter(tmp_path / "ref", M, exit_dim=96))
    for spelling in SPELLINGS:
        for storage in STORAGES:
            state = _state(write_redrafter_drafter(tmp_path / f"{spelling}-{storage}", M, spelling=spelling,
                                                   storage=storage, exit_dim=96))
            keys = redrafter_source_keys(spelling, exit_dim_is_twice_hidden=False, num_draft_layers=2, rnn=True)
            ref_keys = redrafter_source_keys("lm_head", exit_dim_is_twice_hidden=False, num_draft_layers=2, rnn=True)
            for name, key in keys.items():
                assert torch.equal(state[key], ref[ref_keys[name]]), (spelling, storage, name)


@pytest.mark.parametrize("kwargs,error", [({"spelling": "medusa"}, "spelling='medusa'"),
                                          ({"storage": "bin"}, "storage='bin'"),
                                          ({"num_draft_layers": -1}, "num_draft_layers"),
                                          ({"exit_dim": 0}, "exit_dim")])
def test_factory_rejects_bad_arguments(tmp_path, kwargs, error):
    with pytest.raises(ValueError, match=error):
        write_redrafter_drafter(tmp_path / "d", M, **kwargs)


# ---- the reader ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("exit_dim,rnn", SHAPES)
def test_reader_reads_every_spelling(tmp_path, spelling, storage, exit_dim, rnn):
    d = read_redrafter_drafter(write_redrafter_drafter(tmp_path / "d", M, spelling=spelling, storage=storage,
                                                       rnn=rnn, exit_dim=exit_dim))
    e = exit_dim or 2 * H
    assert d.problems == () and (d.hidden_size, d.exit_dim, d.num_draft_layers, d.rnn, d.vocab_size) == (
        H, e, 2, rnn, V)
    assert d.tensor_map() == redrafter_source_keys(spelling, exit_dim_is_twice_hidden=e == 2 * H,
                                                   num_draft_layers=2, rnn=rnn)
    assert d.weights.name == REDRAFTER_STORAGES[storage]
    assert redrafter_mismatches(d, read_base_config(write_hf_base(tmp_path / "base", M))) == []


def test_reader_takes_model_safetensors_before_model_pt(tmp_path):
    d = write_redrafter_drafter(tmp_path / "d", M, storage="pt", seed=1)
    write_redrafter_drafter(tmp_path / "d", M, storage="safetensors", seed=2)
    assert read_redrafter_drafter(d).weights.name == "model.safetensors"  # the converter's order


def _edit_config(d: Path, **changes) -> None:
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    (d / "config.json").write_text(json.dumps(config))


def _edit_weights(d: Path, *, drop=(), put=None) -> None:
    path = d / "model.safetensors"
    state = {k: v for k, v in safetensors.torch.load_file(path).items() if k not in drop}
    safetensors.torch.save_file(state | (put or {}), path)


# each case: how the drafter is made wrong, then the parts its one line must hold (file and field)
MISMATCHES = [
    pytest.param(dict(model=TinyModel(hidden_size=32, num_heads=2, num_kv_heads=1)), {}, {},
                 ("d/config.json", "hidden_size=32", "hidden_size=64"), id="hidden-size"),
    pytest.param(dict(model=TinyModel(vocab_size=128), config_vocab_size=False), {}, {},
                 ("d/model.safetensors", "lm_head.2.weight", "128", "vocab_size=256"), id="vocabulary"),
    pytest.param(dict(exit_dim=96), {}, {"drop": ("input_proj.weight", "input_proj.bias")},
                 ("d/config.json", "exit_dim=96", "2 x hidden_size=64", "input_proj.weight"),
                 id="exit-dim-without-input-proj"),
    pytest.param({}, {"exit_dim": 96}, {},
                 ("d/config.json", "exit_dim=96", "input_proj"), id="exit-dim-not-twice-hidden-in-config"),
    pytest.param({}, {"num_draft_layers": 3}, {},
                 ("d/config.json", "num_draft_layers=3", "lm_head.0.linear, lm_head.1.linear", "lm_head.2.weight",
                  "lm_head.3.weight"), id="num-draft-layers-vs-keys"),
    pytest.param(dict(rnn=False), {"rnn": True}, {},
                 ("d/config.json", "rnn=true", "rnn_u.weight"), id="rnn-missing"),
    pytest.param(dict(rnn=True), {"rnn": False}, {},
                 ("d/config.json", "rnn=false", "rnn_w.weight"), id="rnn-unexpected"),
    pytest.param({}, {"vocab_size": 300}, {}, ("d/config.json", "vocab_size=300", "256"), id="config-vocab"),
    pytest.param({}, {}, {"put": {"lm_heads.0.linear.weight": torch.zeros(128, 128)}},
                 ("d/model.safetensors", "lm_head.*, lm_heads.*"), id="mixed-spellings"),
    pytest.param({}, {}, {"put": {"norm.weight": torch.zeros(64)}},
                 ("d/model.safetensors", "unexpected tensor norm.weight"), id="unknown-tensor"),
    pytest.param({}, {}, {"drop": ("lm_head.1.linear.bias",)},
                 ("d/model.safetensors", "lm_head.1.linear.bias is missing"), id="missing-bias"),
    pytest.param({}, {}, {"put": {"rnn_u.weight": torch.zeros(64, 32)}},
                 ("d/model.safetensors", "rnn_u.weight", "[64, 32]", "expected [64, 64]", "hidden_size=64"),
                 id="rnn-shape"),
]


@pytest.mark.parametrize("make,config,weights,parts", MISMATCHES)
def test_each_mismatch_is_one_line_naming_file_and_field(tmp_path, make, config, weights, parts):
    base = read_base_config(write_hf_base(tmp_path / "base", M))
    d = write_redrafter_drafter(tmp_path / "d", make.pop("model", M), **make)
    if config:
        _edit_config(d, **config)
    if weights:
        _edit_weights(d, **weights)
    lines = redrafter_mismatches(read_redrafter_drafter(d, strict=False), base)
    assert lines and all("\n" not in line for line in lines)
    assert [line for line in lines if all(part in line for part in parts)], lines
    own = read_redrafter_drafter(d, strict=False).problems  # the drafter's own, which strict reading refuses
    if own:
        with pytest.raises(CheckpointError) as e:
            read_redrafter_drafter(d)
        assert str(e.value) == "; ".join(own)


def test_two_mismatches_are_two_lines(tmp_path):
    base = read_base_config(write_hf_base(tmp_path / "base", M))
    d = write_redrafter_drafter(tmp_path / "d", TinyModel(hidden_size=32, num_heads=2, num_kv_heads=1, vocab_size=128))
    lines = redrafter_mismatches(read_redrafter_drafter(d), base)
    assert len(lines) == 2 and "hidden_size=32" in lines[0] and "vocab_size=256" in lines[1]


@pytest.mark.parametrize("change,parts", [({"rnn": None}, ("config.json", "field rnn", "None")),
                                          ({"exit_dim": "128"}, ("config.json", "field exit_dim", "'128'")),
                                          ({"num_draft_layers": -1}, ("config.json", "num_draft_layers", "-1"))])
def test_unreadable_config_fields_are_errors(tmp_path, change, parts):
    d = write_redrafter_drafter(tmp_path / "d", M)
    _edit_config(d, **change)
    with pytest.raises(CheckpointError) as e:
        read_redrafter_drafter(d, strict=False)
    assert all(p in str(e.value) for p in parts) and "\n" not in str(e.value)


def test_no_weights_is_an_error(tmp_path):
    d = write_redrafter_drafter(tmp_path / "d", M)
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors or model.pt"):
        read_redrafter_drafter(d)


# ---- inspect -------------------------------------------------------------------------------------------------

def test_inspect_summarises_a_drafter(tmp_path):
    d = write_redrafter_drafter(tmp_path / "d", M, spelling="lm_heads", storage="pt", exit_dim=96)
    s = inspect_checkpoint(d)
    assert (s.format, s.architecture) == ("redrafter", "ReDrafter drafter")
    assert {k: s.details[k] for k in ("hidden_size", "exit_dim", "input_proj", "num_draft_layers", "rnn",
                                      "vocab_size", "weights")} == {
        "hidden_size": H, "exit_dim": 96, "input_proj": True, "num_draft_layers": 2, "rnn": True, "vocab_size": V,
        "weights": "model.pt"}
    assert "problems" not in s.details and s.details["spelling"].startswith("input_projs.*, lm_heads.")
    result = CliRunner().invoke(cli, ["inspect", str(d)])
    assert result.exit_code == 0 and "redrafter · ReDrafter drafter" in result.output


def test_inspect_prints_one_line_per_problem(tmp_path):
    d = write_redrafter_drafter(tmp_path / "d", M, rnn=False)
    _edit_config(d, num_draft_layers=3, rnn=True)
    result = CliRunner().invoke(cli, ["inspect", str(d)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "config.json:" in line]
    assert len(lines) == 2 and "num_draft_layers=3" in lines[0] and "rnn=true" in lines[1]
    assert lines[0].lstrip().startswith("problems")


def test_inspect_shows_a_converted_checkpoints_redrafter_fields(tmp_path):
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", M), write_redrafter_drafter(tmp_path / "d", M),
                   tp_size=2)
    s = inspect_checkpoint(out)
    assert (s.format, s.architecture) == ("trtllm", "ReDrafterForLLaMALM")
    assert {k: v for k, v in s.details.items() if k.startswith(("redrafter_", "base_model"))} == {
        "base_model_architecture": "LlamaForCausalLM", "redrafter_num_layers": 2, "redrafter_hidden_size": H,
        "redrafter_exit_dim": 2 * H, "redrafter_is_rnn": True, "redrafter_num_beams": 5,
        "redrafter_draft_len_per_beam": 5, "redrafter_greedy_search": True}


# ---- convert -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("exit_dim,rnn", SHAPES)
def test_convert_names_shapes_and_config(tmp_path, arch, tp, exit_dim, rnn):
    m = TinyModel(arch=arch)
    base = write_hf_base(tmp_path / "base", m)
    plain = tmp_path / "plain"
    convert(ConvertOptions(base=base, out=plain, tp_size=tp), show_progress=False)
    out = _convert(tmp_path, base, write_redrafter_drafter(tmp_path / "d", m, rnn=rnn, exit_dim=exit_dim),
                   tp_size=tp)
    e = exit_dim or 2 * H
    for rank in range(tp):
        base_shapes = {k: tuple(v.shape) for k, v in _rank(plain, rank).items()}
        shapes = {k: tuple(v.shape) for k, v in _rank(out, rank).items()}
        assert shapes == base_shapes | expected_drafter_shapes(exit_dim=e, num_layers=2, rnn=rnn, tp=tp)
        base_rank = _rank(plain, rank)
        assert all(torch.equal(t, base_rank[k]) for k, t in _rank(out, rank).items() if k in base_rank)
    cfg = json.loads((out / "config.json").read_text())
    plain_cfg = json.loads((plain / "config.json").read_text())
    redrafter = {"ReDrafterForLLaMALM" if arch == "llama" else "ReDrafterForQWenLM"}
    assert {cfg["architecture"]} == redrafter and cfg["base_model_architecture"] == plain_cfg["architecture"]
    assert {k: cfg[k] for k in cfg if k.startswith("redrafter_")} == {
        "redrafter_num_layers": 2, "redrafter_hidden_size": H, "redrafter_exit_dim": e, "redrafter_is_rnn": rnn,
        "redrafter_num_beams": 5, "redrafter_draft_len_per_beam": 5, "redrafter_greedy_search": True}
    excluded = ["drafter", "drafter.layers", "drafter.lm_head", *(["drafter.rnn_u", "drafter.rnn_w"] if rnn else []),
                "drafter.layers.0", "drafter.layers.0.linear", "drafter.layers.1", "drafter.layers.1.linear",
                *(["drafter.input_proj"] if e != 2 * H else [])]
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None, "exclude_modules": excluded}
    rest = {k: v for k, v in cfg.items() if not k.startswith(("redrafter_", "base_model_"))
            and k not in ("architecture", "quantization")}
    assert rest == {k: v for k, v in plain_cfg.items() if k not in ("architecture", "quantization")}
    assert cfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}


@pytest.mark.parametrize("exit_dim,rnn", SHAPES)
def test_every_spelling_and_storage_converts_to_the_same_checkpoint(tmp_path, exit_dim, rnn):
    base = write_hf_base(tmp_path / "base", M)
    outputs = []
    for spelling in SPELLINGS:
        for storage in STORAGES:
            d = write_redrafter_drafter(tmp_path / f"d-{spelling}-{storage}", M, spelling=spelling, storage=storage,
                                        rnn=rnn, exit_dim=exit_dim)
            outputs.append(_convert(tmp_path, base, d, f"out-{spelling}-{storage}", tp_size=2))
    for out in outputs[1:]:
        for rank in range(2):
            assert (out / f"rank{rank}.safetensors").read_bytes() == (
                outputs[0] / f"rank{rank}.safetensors").read_bytes(), out
        assert (out / "config.json").read_text() == (outputs[0] / "config.json").read_text()


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("vocab,tp", [(256, 1), (256, 2), (256, 4), (250, 4)])
def test_tp_shards_concatenate_to_the_source_tensors(tmp_path, spelling, vocab, tp):
    m = TinyModel(vocab_size=vocab)
    d = write_redrafter_drafter(tmp_path / "d", m, spelling=spelling, exit_dim=96)
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", m), d, tp_size=tp)
    src = _state(d)
    ranks = [_rank(out, r) for r in range(tp)]
    keys = redrafter_source_keys(spelling, exit_dim_is_twice_hidden=False, num_draft_layers=2, rnn=True)
    for name, key in keys.items():
        whole = torch.cat([r[name] for r in ranks], dim=0)  # every drafter Linear splits its output rows
        if name == "drafter.lm_head.weight":
            assert whole.shape[0] == -(-vocab // tp) * tp and torch.count_nonzero(whole[vocab:]) == 0
            whole = whole[:vocab]
        assert torch.equal(whole, src[key]), name
    ckpt = read_trtllm_checkpoint(out)  # trtspec's reader puts them back the same way
    assert all(torch.equal(ckpt.tensor(name), src[key]) for name, key in keys.items())


def test_dtype_casts_the_drafter_with_the_base(tmp_path):
    d = write_redrafter_drafter(tmp_path / "d", M)
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", M), d, dtype="float16")
    ckpt = read_trtllm_checkpoint(out)
    assert ckpt.config["dtype"] == "float16"
    assert torch.equal(ckpt.tensor("drafter.lm_head.weight"), _state(d)["lm_head.2.weight"].half())
    assert {ckpt.dtype(n) for n in ckpt.names()} == {torch.float16}


@pytest.mark.parametrize("version,arch,expected", [
    ("0.15", "llama", "ReDrafterForCausalLM"), ("0.21.0", "llama", "ReDrafterForCausalLM"),
    ("1.0", "llama", "ReDrafterForLLaMALM"), ("1.2.1", "qwen2", "ReDrafterForQWenLM"),
    ("1.0.0rc4", "mistral", "ReDrafterForLLaMALM")])
def test_the_architecture_is_the_versions(tmp_path, version, arch, expected):
    m = TinyModel(arch=arch)
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", m), write_redrafter_drafter(tmp_path / "d", m),
                   trtllm_version=version)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == expected
    provenance = json.loads((out / "trtspec-convert.json").read_text())["redrafter"]
    assert provenance["trtllm_version"] == ".".join(version.split(".")[:2])


def test_qwen2_before_1_0_is_refused(tmp_path):
    m = TinyModel(arch="qwen2")
    with pytest.raises(ConfigError, match="ReDrafterForCausalLM.*1.0 or later"):
        _convert(tmp_path, write_hf_base(tmp_path / "base", m), write_redrafter_drafter(tmp_path / "d", m),
                 trtllm_version="0.21")
    assert not (tmp_path / "out").exists()


def test_cli_options_reach_the_config(tmp_path):
    base, d = write_hf_base(tmp_path / "base", M), write_redrafter_drafter(tmp_path / "d", M)
    result = CliRunner().invoke(cli, ["convert", "--base", str(base), "--out", str(tmp_path / "out"),
                                      "--redrafter", str(d), "--redrafter-num-beams", "4",
                                      "--redrafter-draft-len-per-beam", "3", "--redrafter-no-greedy-search",
                                      "--trtllm-version", "0.20", "--tp-size", "2", "--json"])
    assert result.exit_code == 0, result.output
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (cfg["architecture"], cfg["redrafter_num_beams"], cfg["redrafter_draft_len_per_beam"],
            cfg["redrafter_greedy_search"], cfg["mapping"]["tp_size"]) == ("ReDrafterForCausalLM", 4, 3, False, 2)


def test_cli_default_version_is_the_installed_else_the_newest(tmp_path, monkeypatch):
    import trtspec.engine.trtllm_versions as versions

    base, d = write_hf_base(tmp_path / "base", M), write_redrafter_drafter(tmp_path / "d", M)
    for installed, expected in ((None, "ReDrafterForLLaMALM"), ("0.18.2", "ReDrafterForCausalLM")):
        monkeypatch.setattr(versions, "installed_version", lambda v=installed: v)
        out = tmp_path / f"out-{installed}"
        result = CliRunner().invoke(cli, ["convert", "--base", str(base), "--out", str(out), "--redrafter", str(d),
                                          "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "config.json").read_text())["architecture"] == expected
