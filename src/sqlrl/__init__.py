"""sqlrl: train Text-to-SQL agents with GRPO and prove, with evidence anyone can check, whether training helped.

Importing this package is cheap: no torch, no transformers. Heavy modules import them lazily.
"""

from sqlrl.version import __version__

__all__ = ["__version__"]
