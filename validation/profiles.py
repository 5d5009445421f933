"""Named traffic profiles: prompt/output token lengths and their distribution. Prompts are made
locally from a word list (no downloads); lengths are verified afterwards from the server's usage.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

# One word ~ one token for most BPE tokenizers on common English words; verification against the
# server's usage reports the actual ratio.
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


def request_factory(profile: Profile, seed: int = 0, endpoint: str = "chat"):
    """index -> request body fragment (deterministic per index). Forces exactly output_tokens via
    max_tokens + ignore_eos (vLLM extension; ignored by others) so TPOT compares like with like."""
    def make(i: int) -> dict:
        rng = random.Random(seed * 1_000_003 + i)
        p, o = profile.sample(rng)
        text = make_prompt(p, rng)
        body = {"max_tokens": o, "temperature": 0, "ignore_eos": True, "_prompt_tokens": p}
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
