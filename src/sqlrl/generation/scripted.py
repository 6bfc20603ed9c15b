"""Test doubles that are part of the public API: a tiny chat tokenizer and a scripted policy.

`make_chat_tokenizer()` builds a real `transformers` fast tokenizer (byte-level, no merges, ChatML
template, `<|im_end|>` as eos) without any download, so agent logic can be tested token-exactly.
`ScriptedPolicy` replies with scripted texts (a function of the task and turn, or a fixed list),
encoding them with that tokenizer and ending each reply with eos, exactly as a real policy's
`generate` would return them. Used by the test-suite; handy for users' own agent tests.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlrl.generation.policy import Generation

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_chat_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_special_tokens(
        {"additional_special_tokens": specials[:2], "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    )
    hf.chat_template = CHATML
    hf.padding_side = "left"
    return hf


class ScriptedPolicy:
    """A policy whose replies come from `script(prompt_text, turn_index) -> str`.

    `turn_index` counts this prompt's previous assistant turns (0 for the first). Records every prompt
    it was given (as token ids) in `.calls` for assertions.
    """

    name = "scripted"
    identity = "sha256:scripted"

    def __init__(self, script: Callable[[str, int], str], tokenizer=None):
        self.tokenizer = tokenizer or make_chat_tokenizer()
        self.script = script
        self.eos_token_ids = [self.tokenizer.eos_token_id]
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0, seed=None):
        self.calls.append([list(p) for p in prompts])
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            turn = text.count("<|im_start|>assistant") - 1
            reply = self.script(text, turn)
            gen = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            finish = "stop"
            if len(gen) >= max_new_tokens:
                gen, finish = gen[:max_new_tokens], "length"
            else:
                gen = gen + [self.tokenizer.eos_token_id]
            out.append(
                Generation(
                    token_ids=gen,
                    logprobs=[-0.5] * len(gen),
                    text=self.tokenizer.decode(gen, skip_special_tokens=True),
                    finish_reason=finish,
                )
            )
        return out
