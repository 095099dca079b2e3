"""Apache Beam pipelines: `embed_corpus` (corpus -> embedding or training-pair shards)
and `mine_bitext` (two embedding outputs -> mined pairs). The scripts in
`beam_pipelines/` are their command lines."""
