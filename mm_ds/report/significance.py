"""No result from noise: does the reference beat its control by more than its test set and seeds can explain?

Near-maximal performance (§4.2) is defined against the reference's (BL_BASE's) final score. Where that score is
no better than what untrained target embeddings give (the control), 95% of it is no target; and at chance level a
tenth of a point above the control (XNLI at CPU scale: 33.3 against 33.2 on 5,010 examples) is noise, not
transfer. So a (task, language) gets a target only when the reference's final score beats its control by more
than `Margin.needed`, the difference this test calls significant:

One-sided z-test at level ALPHA (5%; z = 1.645) of H0 "the reference scores no higher than its control",
on the difference of two scores measured on the same n test examples (or masked tokens, for MLM accuracy):

    needed = z * sqrt( 2 p (1 - p) / n  +  s_d^2 / k )      in score points (x100)

  - 2 p (1 - p) / n: the binomial variance of a difference of two accuracies on n examples, with p the mean of
    the two (pooled, as under H0). The two sides are treated as independent samples and the k finetuning seeds
    as one draw of the test set, both conservative (the sides share their examples; the seeds' means average
    some of the noise away). An F1 in [0, 100] has at most this variance at its mean, so QA is covered.
  - s_d^2 / k: the between-seed variance of the per-seed differences (each seed's adapted score minus the same
    finetuned model's control score), over k >= 2 seeds; with one seed it cannot be estimated and is left out.

MLM rows (the alignment check: one Step-2 run per language, n = masked held-out tokens) take the first term
only. Masked tokens of one sequence are not independent, so there the test is an approximation. Records without
an example count cannot be tested: their target keeps the old rule (any margin) and the report says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, variance

from .mdtable import fmt, md
from .records import Result

ALPHA = 0.05
TEST = "one-sided z-test at 5% (binomial variance of n examples + between-seed variance of the paired differences)"


@dataclass(frozen=True)
class Margin:
    """The reference's final score against its control, and the difference the test needs."""
    reference: float
    control: float
    n: int | None
    """Test examples (masked tokens for MLM); None: unknown, not tested."""
    seeds: int
    needed: float | None
    """Score points the reference must beat its control by; None when n is unknown."""

    @property
    def difference(self) -> float:
        return self.reference - self.control

    @property
    def tested(self) -> bool:
        return self.needed is not None

    @property
    def significant(self) -> bool:
        """Beats the control by more than the test's margin (untested: by any amount, the old rule)."""
        return self.difference > (self.needed if self.tested else 0.0)

    def warnings(self, where: str, reference: str) -> list[str]:
        """What the report says about this margin: that it could not be tested, or that it gives no target."""
        out = [] if self.tested else [f"{where}: no example count in the records, so {reference}'s margin over its "
                                      f"control ({self.difference:+.1f}) could not be tested for significance"]
        if not self.significant:
            out.append(f"{where}: {reference}'s final score {self.reference:.1f} does not beat its control "
                       f"{self.control:.1f} (untrained target embeddings)"
                       + (f" by the {self.needed:.2f} points {self.n} examples and {self.seeds} seed(s) make "
                          f"significant (significance.py): no evidence that it transferred" if self.tested else "")
                       + "; no target, times to target or speedups")
        return out


def needed_margin(reference: float, control: float, n: int, paired_differences=(), alpha: float = ALPHA) -> float:
    """The one-sided level-`alpha` margin (score points, 0-100 scale) for two scores on `n` examples, with the
    per-seed differences `paired_differences` (score points) when there are at least two."""
    if n < 1:
        raise ValueError(f"n={n}: a score needs at least one example")
    p = min(max((reference + control) / 200, 0.0), 1.0)
    var = 2 * p * (1 - p) / n * 100 ** 2
    if len(paired_differences) >= 2:
        var += variance(paired_differences) / len(paired_differences)
    return NormalDist().inv_cdf(1 - alpha) * math.sqrt(var)


def margin_of(reference: Result, control: Result, alpha: float = ALPHA) -> Margin:
    """The test of a reference's final result against its control result (records.Result, with n and per_seed)."""
    n = reference.n if reference.n is not None else control.n
    pairs = [a - b for a, b in zip(reference.per_seed, control.per_seed)] \
        if len(reference.per_seed) == len(control.per_seed) else []
    seeds = max(len(reference.per_seed), 1)
    needed = needed_margin(reference.score, control.score, n, pairs, alpha) if n else None
    return Margin(reference.score, control.score, n, seeds, needed)


def margin_table(langs: list[str], margins: dict[str, Margin], targets: dict[str, float]) -> str:
    """Markdown: per language, the reference's final score, its control (ctrl), the difference, the margin the test
    needs, n, seeds, and the target it got (or why none). Its caption: captions.margins."""
    body = []
    for lang in langs:
        m = margins.get(lang)
        if m is None:
            body.append([lang, "—", "no control", "—", "—", "—", "—", fmt(targets.get(lang))])
            continue
        verdict = fmt(targets[lang]) if lang in targets else "none: not significant" if m.tested else "none"
        body.append([lang, fmt(m.reference), fmt(m.control), f"{m.difference:+.2f}",
                     "untested (no n)" if not m.tested else f"{m.needed:.2f}", str(m.n or "—"), str(m.seeds), verdict])
    return md(["lang", "reference final", "ctrl", "difference", f"needed ({ALPHA:.0%}, one-sided)", "n", "seeds",
               "target"], body)
