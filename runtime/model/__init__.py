"""The model: the Llama-family forward over the paged pool (llama.py), one pass over several requests' prefill
chunks and the running decodes (batch.py), attention, the linear kinds and weight formats, and the plain
reference forward that tests compare against."""
