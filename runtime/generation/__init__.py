"""Prompts to tokens for one call: argument checks, SamplingParams / BeamOptions, token selection, the prefill
and decode loop, beam search, streamed text and perplexity windows."""
