"""A step's sums over its micro-batches, and the metrics they become (`StepMetrics.as_dict`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepMetrics:
    """Sums over the micro-batches of one step, turned into the step's metrics by `as_dict`."""

    loss: float = 0.0
    entropy_sum: float = 0.0
    kl_sum: float = 0.0
    kl_policy_ref_sum: float = 0.0
    clipped_sum: float = 0.0
    ratio_sum: float = 0.0
    logprob_diff_sum: float = 0.0
    trained_tokens: int = 0
    processed_tokens: int = 0
    shared_prefix_tokens: int = 0  # prompt tokens a packed forward did not run again
    micro_batches: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(
        self, seconds: float, grad_norm: float, with_kl: bool, with_kl_penalty: bool = False
    ) -> dict[str, float]:
        tokens = max(self.trained_tokens, 1)
        metrics = {
            "loss": self.loss,
            "entropy": self.entropy_sum / tokens,
            "grad_norm": grad_norm,
            "trained_tokens": float(self.trained_tokens),
            "micro_batches": float(self.micro_batches),
            "trainer_seconds": seconds,
            "trainer_tokens_per_second": self.processed_tokens / seconds if seconds else 0.0,
            "shared_prefix_tokens": float(self.shared_prefix_tokens),
            **self.extra,
        }
        if self.ratio_sum:
            metrics["clip_fraction"] = self.clipped_sum / tokens
            metrics["ratio_mean"] = self.ratio_sum / tokens
            metrics["logprob_abs_diff"] = self.logprob_diff_sum / tokens
        if with_kl:
            metrics["kl"] = self.kl_sum / tokens
        if with_kl_penalty:  # ART's name: mean logp_source - logp_ref over trained tokens
            metrics["kl_policy_ref"] = self.kl_policy_ref_sum / tokens
        return metrics
