"""Evaluation: STS (7 tasks) and the training-time dev-set evaluation."""

from hf_sentcl.evaluation.sts import STS_TASKS, STSEvaluator, load_sts_task, spearman_x100

__all__ = ["STS_TASKS", "STSEvaluator", "load_sts_task", "spearman_x100"]
