// memory module: the paged pool (KV blocks; adapter pages later).
