"""Named traffic profiles: prompt/output token lengths and their distribution. Prompts are made
locally from a word list (no downloads). With the served model's tokenizer (a local HF directory)
they have exactly the profile's prompt length as the server counts it; without one, one word is
taken for one token. Either way lengths are verified afterwards from the server's usage.
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Without a tokenizer one word stands for one token; small vocabularies split words, so the real
# count runs higher (about 2x with the tiny model); verification reports the ratio.
WORDS = ("time person year way day thing man world life hand part child eye woman place work week "
         "case point government company number group problem fact able bad best better big black "
         "certain clear different early easy economic federal free full good great hard high human "
         "important international large late little local long low major military national new old "
         "only other political possible public real recent right small social special strong sure "
         "true white whole young river mountain ocean forest city garden window table paper light "
         "music story water money system program question night school family state market").split()


@dataclass(frozen=True)
class Profile:
    name: str
    prompt_tokens: int
    output_tokens: int
    distribution: str = "fixed"   # "fixed" | "uniform" (± spread fraction) | "normal"
    spread: float = 0.0
    description: str = ""

    def sample(self, rng: random.Random) -> tuple[int, int]:
        def draw(mean: int) -> int:
            if self.distribution == "uniform" and self.spread:
                return max(1, int(rng.uniform(mean * (1 - self.spread), mean * (1 + self.spread))))
            if self.distribution == "normal" and self.spread:
                return max(1, int(rng.gauss(mean, mean * self.spread)))
            return mean
        return draw(self.prompt_tokens), draw(self.output_tokens)


PROFILES: dict[str, Profile] = {
    "long-prompt-short-output": Profile("long-prompt-short-output", 1024, 32, "uniform", 0.1,
                                        "prefill-heavy: stresses TTFT and KV transfer"),
    "short-prompt-long-output": Profile("short-prompt-long-output", 64, 256, "uniform", 0.1,
                                        "decode-heavy: stresses ITL/TPOT"),
    "balanced": Profile("balanced", 256, 128, "uniform", 0.1, "mixed"),
}


def get(name: str) -> Profile:
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]


def custom(prompt_tokens: int, output_tokens: int) -> Profile:
    return Profile(f"custom-{prompt_tokens}-{output_tokens}", prompt_tokens, output_tokens)


def make_prompt(n_tokens: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))


class Tokenizer:
    """Prompts of an exact token count for one endpoint, counted as vLLM counts them: chat through
    the model's chat template with the generation prompt, completions as the bare text."""

    def __init__(self, path: str, endpoint: str = "chat"):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # load workers fork after loading
        from transformers import AutoTokenizer
        self.path = str(path)
        self.tok = AutoTokenizer.from_pretrained(self.path)
        self.chat = endpoint == "chat" and bool(self.tok.chat_template)
        # words that are one token after a space: with a byte-level BPE each adds exactly one token
        self.words = [w for w in WORDS if len(self.tok.encode(" " + w, add_special_tokens=False)) == 1]
        if len(self.words) < 16:
            raise ValueError(f"{self.path}: fewer than 16 of the prompt words are single tokens")

    def count(self, text: str) -> int:
        if self.chat:
            ids = self.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True)
            return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return len(self.tok(text)["input_ids"])

    def prompt(self, n_tokens: int, rng: random.Random) -> str:
        """Add or drop words until the count is exact; below the template's own length, one word."""
        words = [rng.choice(self.words)]
        words += [rng.choice(self.words) for _ in range(n_tokens - self.count(words[0]))]
        for _ in range(8):
            c = self.count(" ".join(words))
            if c < n_tokens:
                words += [rng.choice(self.words) for _ in range(n_tokens - c)]
            elif c > n_tokens and len(words) > 1:
                del words[max(1, len(words) - (c - n_tokens)):]
            else:
                break
        return " ".join(words)


def request_factory(profile: Profile, seed: int = 0, endpoint: str = "chat", tokenizer: Tokenizer | None = None,
                    lengths: Callable[[int], tuple[int, int]] | None = None):
    """Request index -> request body fragment (deterministic per index). Forces exactly output_tokens via
    max_tokens + ignore_eos (vLLM extension; ignored by others) so TPOT compares like with like.
    `lengths`: index -> (prompt, output) tokens, e.g. a replayed trace's, instead of the profile's."""
    def make(i: int) -> dict:
        rng = random.Random(seed * 1_000_003 + i)
        p, o = lengths(i) if lengths else profile.sample(rng)
        text = tokenizer.prompt(p, rng) if tokenizer else make_prompt(p, rng)
        body: dict[str, Any] = {"max_tokens": o, "temperature": 0, "ignore_eos": True, "_prompt_tokens": p}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return body
    return make


def verify_lengths(records: list[dict], tolerance: float = 0.25) -> dict:
    """Compare requested lengths to server usage; report mismatches (no failure by itself)."""
    n = 0
    out_mis = []
    p_ratio = []
    for r in records:
        if r.get("warmup") or not r.get("usage"):
            continue
        n += 1
        u = r["usage"]
        exp_o = r.get("expected_output_tokens")
        if exp_o is not None and u.get("completion_tokens") != exp_o:
            out_mis.append({"index": r["index"], "expected": exp_o, "got": u.get("completion_tokens")})
        exp_p = r.get("expected_prompt_tokens")
        if exp_p and u.get("prompt_tokens"):
            p_ratio.append(u["prompt_tokens"] / exp_p)
    mean_ratio = sum(p_ratio) / len(p_ratio) if p_ratio else None
    return {"checked": n, "output_mismatches": len(out_mis), "output_mismatch_samples": out_mis[:5],
            "prompt_ratio_mean": mean_ratio,
            "prompt_mismatch": mean_ratio is not None and abs(mean_ratio - 1) > tolerance}
