"""`deploy --flavour trtllm --rehearse CPU_ENGINE`: the GPU repository (tensorrtllm_backend's layout as the GPU host
gets it: ensemble, preprocessing, postprocessing, BLS, the tensorrt_llm model's tensors and parameters) with its
tensorrt_llm model served by trtspec's CPU engine model, run in the real tritonserver here."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime import LocalGenerator
from trtspec.speculative import GenerationConfig
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer
from trtspec.testing.grpc_requests import grpc_tensor, stream_once

CHOICES = "[[0],[1],[0,0]]"
EAGLE_CHOICES = "[[0],[1],[0,0],[0,0,0],[0,0,0,0]]"  # TensorRT-LLM's EAGLE-1: the tree as deep as the draft's layers
PROMPT = "Speculative decoding drafts tokens and verifies them."


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The same Medusa checkpoint built twice: a TensorRT-LLM engine folder (its plan; the engine files would come from
    a GPU host) and a CPU engine, both with one tree and the tokenizer."""
    root = tmp_path_factory.mktemp("rehearsal")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root / "ckpts", TinyModel(vocab_size=vocab), ("medusa",))["medusa"]
    build(BuildOptions(source=ckpt, out=root / "cpu", choices=CHOICES, tokenizer=root / "tokenizer",
                       max_input_len=64, max_seq_len=160, max_batch_size=4))
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--backend", "trtllm", "--out", str(root / "gpu"),
                                      "--plan-only", "--choices", CHOICES, "--tokenizer", str(root / "tokenizer"),
                                      "--max-batch-size", "4", "--max-input-len", "64", "--max-seq-len", "160"])
    assert result.exit_code == 0, result.output
    return {"cpu": root / "cpu", "gpu": root / "gpu", "root": root, "vocab": vocab}


@pytest.fixture(scope="module")
def pairs(engines):
    """(TensorRT-LLM plan, CPU engine) per other method of the engine flow: EAGLE with one tree; lookahead
    (W, N, G) = 3,3,2 (K = 9), whose CPU stand-in is a plain engine with 9 draft slots."""
    root, tok = engines["root"], engines["root"] / "tokenizer"
    ckpts = tiny_trtllm_checkpoints(root / "ckpts2", TinyModel(vocab_size=engines["vocab"]), ("none", "eagle"))
    shape = ["--max-batch-size", "4", "--max-input-len", "64", "--max-seq-len", "160", "--tokenizer", str(tok)]
    out = {}
    for name, ckpt, gpu_args, cpu_options in (
            ("eagle", ckpts["eagle"], ["--choices", EAGLE_CHOICES], {"choices": EAGLE_CHOICES}),
            ("lookahead", ckpts["none"], ["--lookahead", "3,3,2"], {"max_draft_len": 9})):
        result = CliRunner().invoke(cli, ["build", str(ckpt), "--backend", "trtllm", "--out", str(root / f"{name}-gpu"),
                                          "--plan-only", *gpu_args, *shape])
        assert result.exit_code == 0, result.output
        build(BuildOptions(source=ckpt, out=root / f"{name}-cpu", tokenizer=tok, max_input_len=64, max_seq_len=160,
                           max_batch_size=4, **cpu_options))
        out[name] = {"gpu": root / f"{name}-gpu", "cpu": root / f"{name}-cpu", "root": root}
    return out


def _deploy(engines, out, *extra):
    return CliRunner().invoke(cli, ["deploy", str(engines["gpu"]), "--out", str(out), "--flavour", "trtllm",
                                    "--rehearse", str(engines["cpu"]), "--threads", "1", *map(str, extra)])


def test_the_rehearsed_repository_is_the_gpu_one_but_for_its_engine_model(engines, tmp_path):
    rehearsed = _deploy(engines, tmp_path / "rehearsed")
    assert rehearsed.exit_code == 0, rehearsed.output
    assert "trtspec serve" in rehearsed.output
    gpu = CliRunner().invoke(cli, ["deploy", str(engines["gpu"]), "--out", str(tmp_path / "gpu"), "--flavour",
                                   "trtllm"])
    assert gpu.exit_code == 0, gpu.output
    for model in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert ((tmp_path / "rehearsed" / model / "config.pbtxt").read_text()
                == (tmp_path / "gpu" / model / "config.pbtxt").read_text()), model
        if model != "ensemble":
            assert ((tmp_path / "rehearsed" / model / "1" / "model.py").read_bytes()
                    == (tmp_path / "gpu" / model / "1" / "model.py").read_bytes()), model
    ours, theirs = (text_format.Parse((tmp_path / repo / "tensorrt_llm" / "config.pbtxt").read_text(),
                                      model_config_pb2.ModelConfig()) for repo in ("rehearsed", "gpu"))
    assert ours.backend == "python" and theirs.backend == "tensorrtllm"
    assert list(ours.input) == list(theirs.input) and list(ours.output) == list(theirs.output)  # the GPU tensors
    gpu_params = {k: v.string_value for k, v in theirs.parameters.items()}
    our_params = {k: v.string_value for k, v in ours.parameters.items()}
    assert {k: our_params[k] for k in gpu_params} == gpu_params  # what the GPU host reads, kept
    assert our_params["engine_dir"] == str(engines["cpu"].resolve())
    assert not (tmp_path / "rehearsed" / "launch_triton.sh").exists()


def _whole_text(pair) -> str:
    """The prompt and what the CPU engine decodes after it, detokenized as upstream's postprocessing does."""
    from transformers import AutoTokenizer

    local = LocalGenerator(pair["cpu"], threads=1)
    ids = local.tokenizer.encode(PROMPT, add_special_tokens=True)
    expected = local.generate(ids, GenerationConfig(max_tokens=24, no_spec=True))
    return AutoTokenizer.from_pretrained(str(pair["root"] / "tokenizer")).decode(ids + expected.output_ids,
                                                                                skip_special_tokens=True)


def _served_whole_replies(repo) -> list[str]:
    """The repository served for real; PROMPT's whole reply from the ensemble (24 tokens, not streamed), as
    end_to_end_grpc_client.py asks for it. Fails on any error response."""
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    options = ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as server:
        inputs = [grpc_tensor("text_input", np.array([[PROMPT.encode()]], np.object_)),
                  grpc_tensor("max_tokens", np.array([[24]], np.int32)),
                  grpc_tensor("stream", np.array([[False]], np.bool_))]
        got = stream_once(server.grpc_url, "ensemble", inputs)
    assert [str(e) for _, e in got if e is not None] == []
    return [r.as_numpy("text_output")[0].decode("utf-8", errors="replace") for r, _ in got if r is not None]


@pytest.mark.parametrize("method", ["eagle", "lookahead"])
def test_every_engine_flow_method_is_rehearsed(pairs, method, tmp_path):
    pair = pairs[method]
    deployed = _deploy(pair, tmp_path / "repo")
    assert deployed.exit_code == 0, deployed.output
    whole = _whole_text(pair)
    assert _served_whole_replies(tmp_path / "repo") == [whole]


def test_a_non_decoupled_rehearsal_answers_unary_requests(engines, tmp_path):
    """`--no-decoupled`: the GPU host's tensorrt_llm answers ModelInfer calls in one response; so does its stand-in,
    through the ensemble and the BLS."""
    import tritonclient.grpc as grpcclient

    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    deployed = _deploy(engines, tmp_path / "repo", "--no-decoupled")
    assert deployed.exit_code == 0, deployed.output
    whole = _whole_text(engines)
    options = ServerOptions(repository=tmp_path / "repo", grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for model in ("ensemble", "tensorrt_llm_bls"):
            reply = client.infer(model, [grpc_tensor("text_input", np.array([[PROMPT.encode()]], np.object_)),
                                         grpc_tensor("max_tokens", np.array([[24]], np.int32))])
            assert reply.as_numpy("text_output")[0].decode("utf-8", errors="replace") == whole, model


def test_the_rehearsed_repository_serves_upstreams_requests_as_the_cpu_engine_decodes(engines, tmp_path):
    """The real tritonserver runs the GPU repository: requests to `ensemble` and `tensorrt_llm_bls` as NVIDIA's
    end_to_end_grpc_client.py sends them. A whole reply is the prompt and the tokens the CPU engine decodes in
    process, detokenized as upstream's postprocessing does (transformers, special tokens skipped); a streamed one
    arrives in several responses."""
    from transformers import AutoTokenizer

    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    assert _deploy(engines, tmp_path / "repo").exit_code == 0
    local = LocalGenerator(engines["cpu"], threads=1)
    ids = local.tokenizer.encode(PROMPT, add_special_tokens=True)  # upstream's preprocessing: the text, BOS added
    expected = local.generate(ids, GenerationConfig(max_tokens=24, no_spec=True))
    tokenizer = AutoTokenizer.from_pretrained(str(engines["root"] / "tokenizer"))
    whole = tokenizer.decode(ids + expected.output_ids, skip_special_tokens=True)  # exclude_input_in_output false
    options = ServerOptions(repository=tmp_path / "repo", grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as server:
        for model, stream in (("ensemble", False), ("tensorrt_llm_bls", False), ("ensemble", True),
                              ("tensorrt_llm_bls", True)):
            inputs = [grpc_tensor("text_input", np.array([[PROMPT.encode()]], np.object_)),
                      grpc_tensor("max_tokens", np.array([[24]], np.int32)),
                      grpc_tensor("bad_words", np.array([[b""]], np.object_)),
                      grpc_tensor("stop_words", np.array([[b""]], np.object_)),
                      grpc_tensor("stream", np.array([[stream]], np.bool_))]
            got = stream_once(server.grpc_url, model, inputs)
            errors = [str(e) for _, e in got if e is not None]
            assert not errors, (model, errors)
            texts = [r.as_numpy("text_output")[0].decode("utf-8", errors="replace") for r, _ in got if r is not None]
            if stream:  # each response its new tokens, detokenized alone
                assert len([t for t in texts if t]) > 1, (model, texts)
            else:
                assert texts == [whole], model


@pytest.mark.parametrize("args,message", [
    (["--rehearse", "{gpu}"], "--rehearse {gpu}: a CPU (onnx) engine is needed, found a trtllm engine"),
    (["--rehearse", "{cpu}", "--rehearse-draft", "{cpu}"], "--rehearse-draft: {gpu} is a medusa engine, not a "
                                                          "draft-target pair"),
    (["--rehearse", "{plain}"], "method 'none', but the TensorRT-LLM engine's is 'medusa'"),
    (["--rehearse", "{other}"], "its tree differs from the TensorRT-LLM engine's; build the CPU engine with --choices "
                                "'[[0],[1],[0,0]]' (the TensorRT-LLM engine's)"),
])
def test_a_rehearsal_that_cannot_stand_in_is_one_line(engines, tmp_path, args, message):
    plain = engines["root"] / "plain"
    if not plain.exists():
        ckpt = engines["root"] / "ckpts" / "ckpt-medusa"
        build(BuildOptions(source=ckpt, out=plain, no_spec=True, tokenizer=engines["root"] / "tokenizer",
                           max_input_len=64, max_seq_len=160))
    other = engines["root"] / "other-tree"
    if not other.exists():
        build(BuildOptions(source=engines["root"] / "ckpts" / "ckpt-medusa", out=other, choices="[[0],[1]]",
                           tokenizer=engines["root"] / "tokenizer", max_input_len=64, max_seq_len=160))
    paths = {"gpu": engines["gpu"], "cpu": engines["cpu"], "plain": plain, "other": other}
    result = CliRunner().invoke(cli, ["deploy", str(engines["gpu"]), "--out", str(tmp_path / "r"), "--flavour",
                                      "trtllm", *[a.format(**paths) for a in args]])
    assert result.exit_code != 0
    assert message.format(**paths) in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_rehearse_on_the_cpu_flavour_is_refused(engines, tmp_path):
    result = CliRunner().invoke(cli, ["deploy", str(engines["cpu"]), "--out", str(tmp_path / "r"),
                                      "--rehearse", str(engines["cpu"])])
    assert result.exit_code != 0 and "--rehearse serves a TensorRT-LLM repository's tensorrt_llm model" in result.output


@pytest.fixture(scope="module")
def draft_target(engines):
    """A draft-target pair as the GPU host gets it (the target planned with --draft-target --max-draft-len 4, the
    draft a plain engine) and the two CPU engines that stand in for it: the target plain with 3 draft slots (the
    first drafted token is checked against its prefill's own), the draft plain. `same` is the target's own
    checkpoint as a draft, whose drafts are all accepted."""
    root, tok = engines["root"], engines["root"] / "tokenizer"
    target = tiny_trtllm_checkpoints(root / "dt-target", TinyModel(vocab_size=engines["vocab"]), ("none",))["none"]
    draft = tiny_trtllm_checkpoints(root / "dt-draft", TinyModel(vocab_size=engines["vocab"], num_layers=1,
                                                                 num_heads=2, num_kv_heads=1),
                                    ("none",))["none"]
    shape = ["--max-batch-size", "4", "--max-input-len", "64", "--max-seq-len", "160", "--tokenizer", str(tok)]
    out = {"root": root}
    for name, ckpt, args in (("target-gpu", target, ["--draft-target", "--max-draft-len", "4"]),
                             ("draft-gpu", draft, []), ("same-gpu", target, [])):
        result = CliRunner().invoke(cli, ["build", str(ckpt), "--backend", "trtllm", "--out", str(root / name),
                                          "--plan-only", *args, *shape])
        assert result.exit_code == 0, result.output
        out[name] = root / name
    for name, ckpt, k in (("target-cpu", target, 3), ("draft-cpu", draft, 1), ("same-cpu", target, 1)):
        build(BuildOptions(source=ckpt, out=root / name, tokenizer=tok, max_input_len=64, max_seq_len=160,
                           max_batch_size=4, no_spec=True, max_draft_len=k))
        out[name] = root / name
    return out


def _deploy_pair(pair, out, draft="draft"):
    return CliRunner().invoke(cli, ["deploy", str(pair["target-gpu"]), "--out", str(out), "--flavour", "trtllm",
                                    "--draft-engine", str(pair[f"{draft}-gpu"]), "--rehearse", str(pair["target-cpu"]),
                                    "--rehearse-draft", str(pair[f"{draft}-cpu"]), "--threads", "1"])


def test_a_draft_target_pair_is_rehearsed_through_the_bls_loop(draft_target, tmp_path):
    """The BLS's draft-target loop in the real server: the draft stand-in continues the sequence greedily, the
    target stand-in verifies each draft sent as draft_input_ids and answers its accepted prefix and one token of
    its own. The reply is the target's plain greedy text whichever draft drafts; the target's own checkpoint as the
    draft has every draft accepted."""
    from transformers import AutoTokenizer

    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    local = LocalGenerator(draft_target["target-cpu"], threads=1)
    ids = local.tokenizer.encode(PROMPT, add_special_tokens=True)
    expected = local.generate(ids, GenerationConfig(max_tokens=24, no_spec=True)).output_ids
    tokenizer = AutoTokenizer.from_pretrained(str(draft_target["root"] / "tokenizer"))
    whole = tokenizer.decode(ids + expected, skip_special_tokens=True)
    for draft in ("draft", "same"):
        repo = tmp_path / f"repo-{draft}"
        deployed = _deploy_pair(draft_target, repo, draft)
        assert deployed.exit_code == 0, deployed.output
        options = ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                metrics_port=free_port(), exit_timeout_s=5)
        with TritonServer(options, on_log=lambda line: None) as server:
            inputs = [grpc_tensor("text_input", np.array([[PROMPT.encode()]], np.object_)),
                      grpc_tensor("max_tokens", np.array([[24]], np.int32)),
                      grpc_tensor("num_draft_tokens", np.array([[4]], np.int32))]
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(server.grpc_url)
            reply = client.infer("tensorrt_llm_bls", inputs)
            plain = client.infer("tensorrt_llm_bls", inputs[:2])  # no num_draft_tokens: the target alone
            if draft == "draft":
                assert _client_side_loop(client, ids, 24, 4)[:len(ids) + len(expected)] == ids + expected
        assert reply.as_numpy("text_output")[0].decode() == whole, draft
        assert plain.as_numpy("text_output")[0].decode() == whole, draft
        drafted = int(reply.as_numpy("total_draft_tokens").reshape(-1)[0])
        accepted = int(reply.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
        steps = int(reply.as_numpy("num_verify_steps").reshape(-1)[0])
        assert drafted > 0 and 0 <= accepted <= drafted
        if draft == "same":  # every verify step but the last takes all 4 drafted tokens and one of its own
            assert steps == -(-24 // 5) and accepted == drafted, (steps, accepted, drafted)


def _client_side_loop(client, prompt: list[int], output_len: int, k: int) -> list[int]:
    """The loop of NVIDIA's e2e_grpc_speculative_decoding_client.py (tensorrtllm_backend v0.19.0), which calls the two
    engine models itself: the draft's next tokens, then the target with them as draft_input_ids; every reply is the
    whole sequence (exclude_input_in_output false); it stops at the length, or when a step changes nothing."""
    def call(model, sequence, n, draft=None):
        inputs = [grpc_tensor("input_ids", np.array([sequence], np.int32)),
                  grpc_tensor("input_lengths", np.array([[len(sequence)]], np.int32)),
                  grpc_tensor("request_output_len", np.array([[n]], np.int32)),
                  grpc_tensor("temperature", np.array([[1.0]], np.float32))]
        if draft is not None:
            inputs.append(grpc_tensor("draft_input_ids", np.array([draft], np.int32)))
        reply = client.infer(model, inputs)
        return reply.as_numpy("output_ids")[0, 0, :int(reply.as_numpy("sequence_length")[0, 0])].tolist()

    sequence = list(prompt)
    while len(sequence) < len(prompt) + output_len:
        n = min(k, len(prompt) + output_len - len(sequence) - 1)
        draft = call("tensorrt_llm_draft", sequence, n)[len(sequence):] if n > 0 else None
        new = call("tensorrt_llm", sequence, len(draft) + 1 if draft else 1, draft)
        if new == sequence:
            break
        sequence = new
    return sequence


def test_the_target_stand_in_verifies_a_given_draft_once(draft_target):
    """draft_input_ids through the engine service: the reply is the accepted prefix of the draft and one token of
    the engine's own, 1 .. k + 1 tokens, each the target's greedy continuation."""
    from trtspec.runtime.generator import LocalGenerator as Generator
    from trtspec.triton.serving import parse_request

    local = Generator(draft_target["target-cpu"], threads=1)
    prompt = local.tokenizer.encode(PROMPT, add_special_tokens=True)
    greedy = local.generate(prompt, GenerationConfig(max_tokens=6, no_spec=True)).output_ids
    for draft, expected in ((greedy[:4], greedy[:5]), (greedy[:2] + [(greedy[2] + 1) % 7], greedy[:3]),
                            ([(greedy[0] + 1) % 7] + greedy[1:4], greedy[:1])):
        inputs = {"input_ids": np.array([prompt], np.int32), "request_output_len": np.array([[len(draft) + 1]]),
                  "draft_input_ids": np.array([draft], np.int32)}
        item = parse_request(inputs, local.manifest)[0]
        got = local.generate(item.prompt_ids, item.config).output_ids
        assert got == expected, (draft, got, expected)


@pytest.mark.parametrize("args,message", [
    (["--rehearse-draft", "{draft}"], "give the target's CPU engine with --rehearse too"),
    (["--rehearse", "{target}"], "a draft-target pair needs the draft's CPU engine too (--rehearse-draft"),
    (["--rehearse", "{draft}", "--rehearse-draft", "{draft}"],
     "max_draft_len 1, but the target verifies 4 drafted tokens a step; build the CPU engine with --no-spec "
     "--max-draft-len 3 or more"),
])
def test_a_draft_target_rehearsal_that_cannot_stand_in_is_one_line(draft_target, tmp_path, args, message):
    paths = {"target": draft_target["target-cpu"], "draft": draft_target["draft-cpu"]}
    result = CliRunner().invoke(cli, ["deploy", str(draft_target["target-gpu"]), "--out", str(tmp_path / "r"),
                                      "--flavour", "trtllm", "--draft-engine", str(draft_target["draft-gpu"]),
                                      *[a.format(**paths) for a in args]])
    assert result.exit_code != 0
    assert message.format(**paths) in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_redrafter_engine_is_rehearsed(engines, tmp_path):
    """A ReDrafter checkpoint planned for TensorRT-LLM (decoding_mode redrafter) and built for the CPU engine, which
    runs its beam search under the GPU repository's tensorrt_llm: replies are the CPU engine's greedy text."""
    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.testing import write_hf_base, write_redrafter_drafter

    root, tok = engines["root"], engines["root"] / "tokenizer"
    model = TinyModel(vocab_size=engines["vocab"])
    ckpt = root / "redrafter-ckpt"
    if not ckpt.exists():
        convert(ConvertOptions(base=write_hf_base(root / "redrafter-base", model), out=ckpt,
                               redrafter=write_redrafter_drafter(root / "redrafter-drafter", model),
                               redrafter_num_beams=2, redrafter_draft_len_per_beam=3), show_progress=False)
    pair = {"gpu": tmp_path / "gpu", "cpu": tmp_path / "cpu", "root": root}
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--backend", "trtllm", "--out", str(pair["gpu"]),
                                      "--plan-only", "--tokenizer", str(tok), "--max-batch-size", "4",
                                      "--max-input-len", "64", "--max-seq-len", "160"])
    assert result.exit_code == 0, result.output
    build(BuildOptions(source=ckpt, out=pair["cpu"], tokenizer=tok, max_input_len=64, max_seq_len=160,
                       max_batch_size=4))
    deployed = _deploy(pair, tmp_path / "repo", "--no-backoff")
    assert deployed.exit_code == 0, deployed.output
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'decoding_mode"' in config and '"redrafter"' in config
    whole = _whole_text(pair)
    assert _served_whole_replies(tmp_path / "repo") == [whole]
