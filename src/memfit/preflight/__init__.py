"""`memfit check CONFIG`: pre-flight a training config of axolotl, LLaMA-Factory, torchtune, TRL, mlx-lm or ms-swift."""

from .check import CheckResult, check_config

__all__ = ["CheckResult", "check_config"]
