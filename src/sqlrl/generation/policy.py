"""Policies: token ids in, token ids + log-probs out.

``HFPolicy`` wraps a local Hugging Face model and decodes with ``staticgen`` (``engine="static"``),
``fastgen.generate_fast`` (``"fast"``) or ``fastgen.generate_reference`` (``"hf"``, plain
``model.generate``); ``"auto"`` (default) is ``static`` for the families it supports (Llama, Qwen2),
else ``fast``. ``OpenAIPolicy`` talks to an OpenAI-compatible ``/v1/completions`` server (e.g. vLLM)
with the standard library only.

What is covered:
- Prompts are token ids, never re-tokenized; one ``Generation`` per prompt, in input order, whose
  ``token_ids`` include the stop token when one was produced (``finish_reason="stop"``), with one
  log-prob per token (``HFPolicy``: under ``logits / temperature``, raw logits for greedy) and
  ``text = tokenizer.decode(token_ids, skip_special_tokens=True)``.
- ``HFPolicy.generate`` runs in eval mode under ``torch.no_grad`` and restores the train/eval mode; on
  a GPU out-of-memory error it retries with half the batch, down to one sequence, keeps the smaller
  batch and appends each change to ``memory_adjustments`` (sampling draws do not depend on the batch).
- ``OpenAIPolicy`` raises ``PolicyInfraError`` for every infrastructure failure (connection, timeout,
  HTTP error, malformed answer), which the agent counts as infra failures, never as wrong answers.

What is not:
- ``HFPolicy.identity`` is not recomputed when the weights change: call ``refresh_identity()``.
- ``OpenAIPolicy`` returns token ids only when the server provides them (vLLM: ``return_token_ids``);
  servers usually report log-probs of the *unscaled* distribution; ``seed`` is honoured only if the
  server supports it; its ``identity`` is a label (``openai:<base_url>#<model>``) unless one is passed.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from sqlrl.agent.loop import PolicyInfraError

log = logging.getLogger(__name__)

__all__ = ["Generation", "HFPolicy", "OpenAIPolicy", "PolicyInfraError", "eos_token_ids"]


@dataclass
class Generation:
    token_ids: list[int]  # generated ids, including the stop token if one was produced
    logprobs: list[float]  # log p(token) under the sampling distribution (logits / temperature)
    text: str  # decoded token_ids, special tokens skipped
    finish_reason: str  # "stop" | "length"


_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Stop tokens: the generation config's ``eos_token_id`` (int or list), the tokenizer's eos, and the
    usual chat end markers (``<|im_end|>``, ``<|endoftext|>``, ...) that exist in the vocabulary."""
    ids: list[int] = []

    def add(x: Any) -> None:
        if x is None:
            return
        if isinstance(x, (list, tuple)):
            for y in x:
                add(y)
            return
        if int(x) not in ids:
            ids.append(int(x))

    gen = getattr(model, "generation_config", None)
    add(getattr(gen, "eos_token_id", None))
    if tokenizer is not None:
        add(getattr(tokenizer, "eos_token_id", None))
        try:
            vocab = tokenizer.get_vocab()
        except Exception:  # noqa: BLE001 -- a tokenizer without a vocab simply adds nothing
            vocab = {}
        for tok in _STOP_TOKENS:
            if tok in vocab:
                add(vocab[tok])
    if not ids:
        add(getattr(getattr(model, "config", None), "eos_token_id", None))
    return ids


ENGINES = ("auto", "static", "fast", "hf")


class HFPolicy:
    """``HFPolicy(loaded)`` with a ``models.LoadedModel``, or ``HFPolicy(model, tokenizer, name=..., identity=...)``.

    ``engine``: ``"auto"`` (``static`` when ``staticgen.supports(model)``, else ``fast``), ``"static"``
    (``staticgen.generate_static``, up to ``max_batch`` slots), ``"fast"`` (``fastgen.generate_fast``,
    batches of up to ``max_batch`` rows) or ``"hf"`` (``fastgen.generate_reference``, batches of
    ``batch_size``). The resolved choice is in ``self.engine``."""

    def __init__(
        self,
        loaded: Any,
        tokenizer: Any = None,
        *,
        engine: str = "auto",
        batch_size: int = 64,
        max_batch: int = 256,
        name: str | None = None,
        identity: str | None = None,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
    ):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if hasattr(loaded, "model") and hasattr(loaded, "tokenizer") and hasattr(loaded, "identity"):
            model, tok = loaded.model, tokenizer or loaded.tokenizer
            name = name or loaded.name
            identity = identity or loaded.identity
            if pad_token_id is None:
                pad_token_id = getattr(loaded, "pad_token_id", None)
        else:
            model, tok = loaded, tokenizer
        if tok is None:
            raise ValueError("HFPolicy needs a tokenizer (to decode text and find the stop tokens)")
        self.model = model
        self.tokenizer = tok
        if engine in ("auto", "static"):
            from sqlrl.generation.staticgen import supports

            ok, why = supports(model)
            if engine == "static" and not ok:
                raise ValueError(
                    f"engine 'static' cannot run this model ({why}); use engine 'fast' or 'auto'"
                )
            engine = "static" if ok else "fast"
        self.engine = engine
        self.batch_size = int(batch_size)
        self.max_batch = int(max_batch)
        self.memory_adjustments: list[dict] = []  # batch sizes lowered after out-of-memory errors
        self.name = (
            name or getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
        )
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids else _policy_eos(model, tok)
        if pad_token_id is None:
            pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_token_ids[0]
        self.pad_token_id = int(pad_token_id)
        self.identity = identity if identity is not None else self.refresh_identity()

    def refresh_identity(self) -> str:
        """Recompute the weights hash (after the weights changed) and store it in ``identity``."""
        from sqlrl.generation.models import weights_hash

        self.identity = weights_hash(self.model)
        return self.identity

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[Generation]:
        import torch

        from sqlrl.generation import fastgen

        prompts = [list(map(int, p)) for p in prompts]
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt (no token ids)")
        common = dict(
            max_new_tokens=int(max_new_tokens),
            temperature=float(temperature),
            top_p=float(top_p),
            seed=seed,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
        )
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            while True:  # once, unless the GPU runs out of memory (then again with smaller batches)
                try:
                    with torch.no_grad():
                        if self.engine == "static":
                            from sqlrl.generation import staticgen

                            raw = staticgen.generate_static(
                                self.model, prompts, max_batch=self.max_batch, **common
                            )
                        elif self.engine == "fast":
                            raw = fastgen.generate_fast(
                                self.model, prompts, max_batch=self.max_batch, **common
                            )
                        else:
                            raw = fastgen.generate_reference(
                                self.model, prompts, batch_size=self.batch_size, **common
                            )
                    break
                except torch.OutOfMemoryError:
                    pass  # handled below, outside the except block, so that its frames free their tensors
                self._halve_batch(len(prompts))
        finally:
            if was_training:
                self.model.train()
        if len(raw) != len(prompts):
            raise RuntimeError(f"fastgen returned {len(raw)} results for {len(prompts)} prompts")
        out = []
        for ids, lps, reason in raw:
            ids = [int(t) for t in ids]
            out.append(
                Generation(
                    token_ids=ids,
                    logprobs=[float(x) for x in lps],
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason=str(reason),
                )
            )
        return out

    @property
    def batch_attr(self) -> str:
        """The batch-size attribute this engine uses: ``batch_size`` for ``"hf"``, else ``max_batch``."""
        return "batch_size" if self.engine == "hf" else "max_batch"

    def release_memory(self) -> bool:
        """Drop the static engine's KV cache and CUDA graphs (kept between calls; the next call
        rebuilds them) and return cached CUDA blocks, e.g. before a training update. Whether a cache was
        dropped (False for the other engines, which keep none between calls)."""
        from sqlrl.generation.device import free_memory

        dropped = False
        if self.engine == "static":
            from sqlrl.generation import staticgen

            dropped = staticgen.release(self.model)
        free_memory()
        return dropped

    def _halve_batch(self, n_prompts: int) -> None:
        """After an out-of-memory error in generation: drop the static engine's cache, free the CUDA cache
        and halve the batch (kept for the rest of this policy's life, recorded in
        ``memory_adjustments``). Sampling draws depend on (seed, prompt index, step), not on the batch,
        so the retry draws the same random numbers. Raises RuntimeError when the batch is already 1."""
        self.release_memory()
        attr = self.batch_attr
        size = min(getattr(self, attr), n_prompts)
        if size <= 1:
            raise RuntimeError(
                f"generation ran out of GPU memory with one sequence at a time ({self.engine} engine): "
                "lower agent.max_new_tokens / agent.max_context_tokens, or use a smaller model"
            )
        setattr(self, attr, max(1, size // 2))
        self.memory_adjustments.append({"engine": self.engine, attr: getattr(self, attr)})
        log.warning(
            f"sqlrl: generation ran out of GPU memory at {size} sequences per batch; retrying with "
            f"{getattr(self, attr)} (run.gen_max_batch; kept from now on)"
        )


def _policy_eos(model: Any, tokenizer: Any) -> list[int]:
    ids = eos_token_ids(model, tokenizer)
    if not ids:
        raise ValueError("no eos token id found in the generation config or tokenizer; pass eos_token_ids=")
    return ids


class OpenAIPolicy:
    """An OpenAI-compatible completions server. ``base_url`` like ``http://127.0.0.1:8000`` (``/v1`` is
    appended unless present). One request per chunk of ``max_batch`` prompts (``prompt`` as a list of
    token-id lists), retried ``retries`` times on connection errors, timeouts and HTTP 5xx/429."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 300.0,
        *,
        tokenizer: Any = None,
        retries: int = 2,
        max_batch: int = 64,
        identity: str | None = None,
        extra_body: dict | None = None,
    ):
        url = base_url.rstrip("/")
        self.url = (url if url.endswith("/v1") else url + "/v1") + "/completions"
        self.base_url = base_url
        self.model_name = model
        self.name = model
        self.api_key = api_key
        self.timeout = float(timeout)
        self.tokenizer = tokenizer
        self.retries = int(retries)
        self.max_batch = int(max_batch)
        self.identity = identity or f"openai:{url}#{model}"
        self.extra_body = dict(extra_body or {})

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                detail = e.read()[:500].decode("utf-8", "replace") if e.fp else ""
                last = PolicyInfraError(f"{self.url}: HTTP {e.code}: {detail}")
                if e.code >= 500 or e.code == 429:
                    continue
                raise last from e
            except (
                urllib.error.URLError,
                http.client.HTTPException,
                OSError,
            ) as e:  # timeouts, refused, reset
                last = PolicyInfraError(f"{self.url}: {type(e).__name__}: {getattr(e, 'reason', e)}")
                continue
            try:
                return json.loads(raw)
            except ValueError as e:
                raise PolicyInfraError(f"{self.url}: answer is not JSON: {raw[:200]!r}") from e
        assert last is not None
        raise last

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch):
            chunk = [list(map(int, p)) for p in prompts[start : start + self.max_batch]]
            body: dict = {
                "model": self.model_name,
                "prompt": chunk,
                "max_tokens": int(max_new_tokens),
                "temperature": float(temperature),
                "top_p": float(top_p),
                "logprobs": 1,
                "echo": False,
                "return_token_ids": True,  # vLLM >= 0.10
                "return_tokens_as_token_ids": True,  # vLLM: logprobs.tokens as "token_id:N"
            }
            if seed is not None:
                body["seed"] = int(seed) + start
            body.update(self.extra_body)
            out.extend(self._parse(self._post(body), len(chunk)))
        return out

    def _parse(self, answer: Any, n: int) -> list[Generation]:
        try:
            choices = answer["choices"]
            if not isinstance(choices, list) or len(choices) != n:
                raise PolicyInfraError(
                    f"{self.url}: expected {n} choices, got {len(choices) if isinstance(choices, list) else choices!r}"
                )
            by_index = sorted(choices, key=lambda c: int(c.get("index", 0)))
            if [int(c.get("index", i)) for i, c in enumerate(by_index)] != list(range(n)):
                raise PolicyInfraError(f"{self.url}: choice indices are not 0..{n - 1}")
            return [self._one(c) for c in by_index]
        except PolicyInfraError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PolicyInfraError(f"{self.url}: malformed completion answer: {type(e).__name__}: {e}") from e

    def _one(self, c: dict) -> Generation:
        reason = c.get("finish_reason")
        if reason not in ("stop", "length"):
            raise PolicyInfraError(f"{self.url}: unexpected finish_reason {reason!r}")
        lp = c.get("logprobs") or {}
        token_lps = [float(x) if x is not None else float("nan") for x in (lp.get("token_logprobs") or [])]
        ids = c.get("token_ids")
        if ids is None and lp.get("tokens") and all(str(t).startswith("token_id:") for t in lp["tokens"]):
            ids = [int(str(t).split(":", 1)[1]) for t in lp["tokens"]]
        ids = [int(t) for t in ids] if ids is not None else []
        if ids and token_lps and len(ids) != len(token_lps):
            raise PolicyInfraError(f"{self.url}: {len(ids)} token ids but {len(token_lps)} log-probs")
        text = c.get("text")
        if self.tokenizer is not None and ids:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if text is None:
            raise PolicyInfraError(f"{self.url}: choice without text")
        return Generation(token_ids=ids, logprobs=token_lps, text=str(text), finish_reason=reason)
