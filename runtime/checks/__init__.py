"""A model directory checked against its manifest: the claims (model_claims), what load() checks and in which
order (integrity), the graph at its claimed context (graph_check) and the parity fingerprint (fingerprint)."""
