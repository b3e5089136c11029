"""trtspec BLS (TensorRT-LLM repository): text in, text out, with the draft-target loop when a draft model is set.

Without `num_draft_tokens` (or without a draft model) a request goes preprocessing → tensorrt_llm →
postprocessing, streaming when the models are decoupled. With `num_draft_tokens` = n > 0 every verify step is

    draft  = draft model's next k = min(n, tokens left - 1) tokens (greedy continuation of the sequence)
    new    = target(sequence, draft_input_ids=draft)  # 1..k+1 tokens: the accepted draft prefix + one of its own
    accepted += |common prefix of new and draft|,  sequence += new

The target engine checks the draft inside (`draft_tokens_external`); each call resends the whole sequence and
KV-cache reuse keeps the prefix. Every internal call sets `exclude_input_in_output` itself, so the loop does not
depend on the models' parameters (upstream's v0.19 BLS misread drafts when that parameter was true).
"""

import os
import site
import sys

# a rehearsal on a host without the TensorRT-LLM container (`deploy --rehearse`): the serving venv's packages, which
# the Python backend stub's embedded interpreter does not see otherwise; unset on a GPU host, where this does nothing
for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)

import json  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

# client tensor → tensorrt_llm tensor where the names differ (tensorrtllm_backend ensemble wiring)
RENAMED = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "length_penalty": "len_penalty", "stream": "streaming"}
# LoRA, prompt tuning and guided decoding go to the target model only: the draft of a draft-target pair is a plain
# engine, and the target decides (verifies) every token either way
TARGET_ONLY = ("prompt_embedding_table", "prompt_vocab_size", "lora_task_id", "lora_weights", "lora_config",
               "guided_decoding_guide_type", "guided_decoding_guide")
PASSED = ("temperature", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_length", "min_tokens",
          "random_seed", "seed", "return_log_probs", "return_context_logits", "return_generation_logits",
          "return_perf_metrics", "return_kv_cache_reuse_stats", "num_return_sequences", "beam_width",
          "exclude_input_in_output") + TARGET_ONLY
# client tensor → preprocessing input, and preprocessing's outputs (tensorrtllm_backend ensemble/config.pbtxt)
PRE_INPUTS = {"text_input": "QUERY", "decoder_text_input": "DECODER_QUERY", "max_tokens": "REQUEST_OUTPUT_LEN",
              "bad_words": "BAD_WORDS_DICT", "stop_words": "STOP_WORDS_DICT",
              "embedding_bias_words": "EMBEDDING_BIAS_WORDS", "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
              "end_id": "END_ID", "pad_id": "PAD_ID", "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID"}
PRE_OUTPUTS = ("INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS",
               "EMBEDDING_BIAS", "OUT_END_ID", "OUT_PAD_ID")
PRE_OPTIONAL = ("OUT_PROMPT_TABLE_EXTRA_IDS",)  # only with prompt_table_extra_id
LLM_OUTPUTS = ("output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "batch_index", "sequence_index")
LOGITS = ("context_logits", "generation_logits")
# tensorrt_llm's perf metrics (TensorRT-LLM 0.19+, with return_perf_metrics), passed on where this model declares them
PERF_METRICS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
                "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
                "total_accepted_draft_tokens", "total_draft_tokens")


class LoopResult:
    def __init__(self, tokens, drafted, accepted, steps):
        self.tokens, self.drafted, self.accepted, self.steps = tokens, drafted, accepted, steps


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def speculative_loop(prompt, max_tokens, num_draft, draft_fn, target_fn, end_id, stop_sequences=()):
    """The draft-target loop over token lists; draft_fn(seq, k) → ≤ k ids, target_fn(seq, draft) → 1..k+1 ids."""
    sequence, out = list(prompt), []
    drafted = accepted = steps = 0
    while len(out) < max_tokens:
        k = min(num_draft, max_tokens - len(out) - 1)
        draft = list(draft_fn(sequence, k))[:k] if k > 0 else []
        new = list(target_fn(sequence, draft))[:len(draft) + 1]
        steps, drafted = steps + 1, drafted + len(draft)
        if not new:
            break
        accepted += min(common_prefix(new, draft), len(new) - 1)
        if end_id in new:
            new = new[:new.index(end_id)]
            out += new
            break
        sequence, out = sequence + new, out + new
        if any(len(s) and out[-len(s):] == list(s) for s in stop_sequences):
            break
    return LoopResult(out[:max_tokens], drafted, accepted, steps)


class StreamText:
    """The text a stream of token chunks adds, chunk by chunk, without ever ending inside a character: each chunk is
    decoded after the last CONTEXT tokens before it (byte-level and SentencePiece decoders merge across the
    boundary) and a trailing U+FFFD (a character whose bytes are not all there yet) waits for the next chunk."""

    CONTEXT = 16
    REPLACEMENT = "\ufffd"

    def __init__(self, detokenize):
        self.detokenize = detokenize  # list of id lists → list of texts
        self.context = []

    def _strip(self, text):
        return text[:-1] if text.endswith(self.REPLACEMENT) else text

    def add(self, ids):
        before, after = self.detokenize([self.context, self.context + list(ids)])
        before, after = self._strip(before), self._strip(after)
        self.context = (self.context + list(ids))[-self.CONTEXT:]
        if after.startswith(before):
            return after[len(before):]
        return self._strip(self.detokenize([list(ids)])[0])  # should not happen; the new tokens alone

    def flush(self):
        """What the held-back bytes decode to once the stream is over ("" when nothing is held)."""
        if not self.context:
            return ""
        return self.REPLACEMENT if self.detokenize([self.context])[0].endswith(self.REPLACEMENT) else ""


def parse_bool(text, default=False):
    if not text:  # absent or empty: the default
        return default
    return str(text).strip().lower() in ("true", "1", "t", "y", "yes")


def stop_sequences(words):
    """[1, 2, L] TensorRT-LLM word list → list of id sequences."""
    words = np.asarray(words).reshape(2, -1)
    ids, offsets = words[0].tolist(), [o for o in words[1].tolist() if o >= 0]
    return [ids[start:end] for start, end in zip([0] + offsets[:-1], offsets)]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.target = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        self.target_decoupled = parse_bool(params.get("tensorrt_llm_decoupled"))
        self.draft = params.get("tensorrt_llm_draft_model_name") or None
        self.max_draft_len = int(params.get("max_draft_len") or 0)
        self.input_names = {t["name"] for t in config.get("input", [])}
        declared = {t["name"] for t in config.get("output", [])}
        self.llm_outputs = LLM_OUTPUTS + tuple(name for name in LOGITS + PERF_METRICS if name in declared)

    def execute(self, requests):
        unary = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            last = None
            try:
                for response in self.generate(request):  # streamed as produced when decoupled
                    if sender is not None:
                        sender.send(response)
                    last = response
            except Exception as e:  # one bad request must not fail the others
                last = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e)))
                if sender is not None:
                    sender.send(last)
            if sender is not None:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                unary.append(last if last is not None else pb_utils.InferenceResponse(output_tensors=[]))
        return None if self.decoupled else unary

    # ---- one request ---------------------------------------------------------------------------------

    def generate(self, request):
        client = {name: t.as_numpy() for name in self.input_names
                  if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None}
        n = int(client.get("num_draft_tokens", np.zeros((1, 1)))[0][0])
        if bool(client.get("use_draft_logits", np.zeros((1, 1), dtype=bool)).any()):
            raise ValueError("use_draft_logits is not supported by trtspec's BLS: drafts are accepted by token match")
        if bool(client.get("stream", np.zeros(1, dtype=bool)).any()) and not self.decoupled:
            raise ValueError("Streaming is only supported if model is deployed using decoupled mode "
                             "(trtspec deploy --decoupled)")
        pre = self.preprocess(client)
        if n > 0:
            yield self.speculative(client, pre, n)
            return
        streamed = bool(client.get("stream", np.zeros(1, dtype=bool)).any()) and self.target_decoupled
        if not streamed or pre["INPUT_ID"].shape[0] != 1:
            for response in self.call_llm(self.target, self.llm_inputs(client, pre), self.target_decoupled):
                yield self.respond(response)
            return
        # Streamed, each response carries only its new tokens: decode them after the tokens before them and hold a
        # character whose bytes are not all generated yet back for the next response; the last flushes it.
        text = StreamText(self.detokenize)
        for response in self.call_llm(self.target, self.llm_inputs(client, pre), self.target_decoupled):
            if response["output_ids"].ndim != 3 or response["output_ids"].shape[:2] != (1, 1):  # beams: as decoded
                yield self.respond(response)
                continue
            length = int(response["sequence_length"].reshape(-1)[0])
            piece = text.add(response["output_ids"].reshape(-1)[:length].tolist())
            yield self.respond(response, text=np.array([piece.encode("utf-8")], dtype=object))
        tail = text.flush()
        if tail:
            yield pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([tail.encode("utf-8")], dtype=object))])

    def detokenize(self, sequences):
        """Token id lists → their texts, through the postprocessing model (one batch)."""
        width = max([len(ids) for ids in sequences] + [1])
        tokens = np.zeros((len(sequences), 1, width), dtype=np.int32)
        for b, ids in enumerate(sequences):
            tokens[b, 0, :len(ids)] = ids
        lengths = np.array([[len(ids)] for ids in sequences], dtype=np.int32)
        request = pb_utils.InferenceRequest(model_name="postprocessing", requested_output_names=["OUTPUT"],
                                            inputs=[pb_utils.Tensor("TOKENS_BATCH", tokens),
                                                    pb_utils.Tensor("SEQUENCE_LENGTH", lengths)])
        texts = self.outputs(request.exec(), ("OUTPUT",))["OUTPUT"].reshape(-1)
        return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]

    def speculative(self, client, pre, n):
        if self.draft is None:
            raise ValueError("num_draft_tokens > 0 needs a draft model; deploy with a draft engine "
                             "(trtspec deploy --draft-engine DIR)")
        if n > self.max_draft_len:  # tensorrtllm_backend#473: would fail inside the target engine
            raise ValueError(f"num_draft_tokens {n} exceeds the target engine's max_draft_len {self.max_draft_len}")
        if pre["INPUT_ID"].shape[0] != 1 or bool(client.get("stream", np.zeros(1, dtype=bool)).any()):
            raise ValueError("draft-target decoding takes one prompt per request and no streaming")
        if int(client.get("beam_width", np.ones((1, 1)))[0][0]) != 1:
            raise ValueError("draft-target decoding does not support beam search (beam_width must be 1)")
        prompt = pre["INPUT_ID"][0, :int(pre["REQUEST_INPUT_LEN"][0][0])].tolist()
        end_id = int(pre["OUT_END_ID"][0][0])

        def call(model, sequence, k, draft=None):
            inputs = self.llm_inputs(client, pre, ids=sequence, output_len=k, exclude_input=True,
                                     target=model != self.draft)
            if draft is not None:
                inputs["draft_input_ids"] = np.array([draft], dtype=np.int32)
            response = next(iter(self.call_llm(model, inputs, False)))
            ids, length = response["output_ids"], response["sequence_length"]
            return ids[0, 0, :int(length[0][0])].tolist()

        result = speculative_loop(prompt, int(pre["REQUEST_OUTPUT_LEN"][0][0]), n,
                                  lambda seq, k: call(self.draft, seq, k),
                                  lambda seq, d: call(self.target, seq, len(d) + 1, draft=d),
                                  end_id, stop_sequences(pre["STOP_WORDS_IDS"][0]))
        keep_prompt = not bool(client.get("exclude_input_in_output", np.zeros(1, dtype=bool)).any())
        tokens = (prompt if keep_prompt else []) + result.tokens
        extra = {"num_accepted_tokens": result.accepted, "num_verify_steps": result.steps,
                 "total_draft_tokens": result.drafted, "total_accepted_draft_tokens": result.accepted}
        return self.respond({"output_ids": np.array([[tokens]], dtype=np.int32),
                             "sequence_length": np.array([[len(tokens)]], dtype=np.int32)}, extra)

    # ---- model calls ---------------------------------------------------------------------------------

    def preprocess(self, client):
        inputs = [pb_utils.Tensor(target, client[source]) for source, target in PRE_INPUTS.items() if source in client]
        request = pb_utils.InferenceRequest(model_name="preprocessing", inputs=inputs,
                                            requested_output_names=list(PRE_OUTPUTS + PRE_OPTIONAL))
        return self.outputs(request.exec(), PRE_OUTPUTS + PRE_OPTIONAL, required=PRE_OUTPUTS)

    def llm_inputs(self, client, pre, *, ids=None, output_len=None, exclude_input=None, target=True):
        if ids is None:
            inputs = {"input_ids": pre["INPUT_ID"], "input_lengths": pre["REQUEST_INPUT_LEN"],
                      "request_output_len": pre["REQUEST_OUTPUT_LEN"]}
        else:
            inputs = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
                      "request_output_len": np.array([[output_len]], dtype=np.int32)}
        inputs.update(end_id=pre["OUT_END_ID"], pad_id=pre["OUT_PAD_ID"], stop_words_list=pre["STOP_WORDS_IDS"],
                      bad_words_list=pre["BAD_WORDS_IDS"], embedding_bias=pre["EMBEDDING_BIAS"])
        inputs.update({RENAMED.get(k, k): v for k, v in client.items()
                       if (k in RENAMED or k in PASSED) and (target or k not in TARGET_ONLY)})
        extra = pre.get("OUT_PROMPT_TABLE_EXTRA_IDS")
        if extra is not None and target:  # a resent sequence: its new tokens are ordinary ones (0)
            width = inputs["input_ids"].shape[1]
            inputs["prompt_table_extra_ids"] = np.zeros((extra.shape[0], width), dtype=np.uint64)
            inputs["prompt_table_extra_ids"][:, :min(width, extra.shape[1])] = extra[:, :width]
        if exclude_input is not None:
            inputs["exclude_input_in_output"] = np.array([[exclude_input]], dtype=bool)
            inputs.pop("streaming", None)
        return inputs

    def call_llm(self, model, inputs, decoupled):
        request = pb_utils.InferenceRequest(model_name=model, requested_output_names=list(self.llm_outputs),
                                            inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()])
        responses = request.exec(decoupled=True) if decoupled else [request.exec()]
        for response in responses:
            if decoupled and not response.output_tensors():  # the final empty response of a decoupled stream
                continue
            yield self.outputs(response, self.llm_outputs, required=("output_ids", "sequence_length"))

    def outputs(self, response, names, required=None):
        if response.has_error():
            raise ValueError(response.error().message())
        out = {}
        for name in names:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is not None:
                out[name] = tensor.as_numpy()
            elif name in (required or names):
                raise ValueError(f"model response lacks {name}")
        return out

    def respond(self, llm, extra=None, text=None):
        """A client response from an engine response; `text` (1-D bytes) replaces postprocessing's text_output."""
        request = pb_utils.InferenceRequest(
            model_name="postprocessing", requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("TOKENS_BATCH", llm["output_ids"]),
                    pb_utils.Tensor("SEQUENCE_LENGTH", llm["sequence_length"])])
        post = self.outputs(request.exec(), ("OUTPUT",))
        # output_ids as tensorrt_llm sends it, [1, beams, L] (-1 after a shorter beam), as the ensemble passes it on
        tensors = [pb_utils.Tensor("text_output", post["OUTPUT"] if text is None else text),
                   pb_utils.Tensor("output_ids", np.asarray(llm["output_ids"], dtype=np.int32))]
        extra = extra or {}
        tensors += [pb_utils.Tensor(k, llm[k]) for k in self.llm_outputs[2:] if k in llm and k not in extra]
        for name, value in extra.items():
            tensors.append(pb_utils.Tensor(name, np.array([[value]], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)
