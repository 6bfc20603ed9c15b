"""sqlrl: train Text-to-SQL agents with GRPO and prove, with evidence anyone can check, whether training helped.

Importing this package is cheap: no torch, no transformers. Heavy modules import them lazily.
"""

__version__ = "0.1.0"
