"""Data: corpus preparation (`corpus`), token shards (`shards`), MLM pretraining batches (`mlm`)."""
