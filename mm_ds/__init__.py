"""mm-ds: mini-model adaptation of pretrained masked language models to new languages, on DeepSpeed."""

__version__ = "0.1.0"
