"""Tools beside the product: `mm-ds bench`, built on the stages builders and the engines."""
