"""The export stage's table of each GGUF file as llama.cpp itself reads it (stages/export.py), which this family's
report section reads by name (report.py): its ids of the test text beside the folder tokenizer's, llama-perplexity's
estimate beside the pipeline's own on those tokens, and llama-bench's prompt and decode speed beside the unpruned
file's of the same type, with the ideals: the ratio of FLOPs per prompt token, and of the bytes a decoded token reads
(the file's). A language-modelling table, so its name lives with the family rather than in pipeline/files/schema.py
beside every stage's."""

LLAMA_CPP_TABLE = "llama_cpp.csv"
LLAMA_CPP_COLUMNS = ["model", "type", "gguf_mib", "tokens", "tokens_equal", "first_differing_token",
                     "perplexity_pipeline", "perplexity_llama_cpp", "prompt_tokens_per_s", "decode_tokens_per_s",
                     "prompt_speedup", "decode_speedup", "ideal_prompt_speedup_flops", "ideal_decode_speedup_bytes",
                     "not_measured_because"]
