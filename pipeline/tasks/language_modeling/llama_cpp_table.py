"""The export stage's table of each GGUF file as llama.cpp itself reads it (stages/export.py), which this family's
report section reads by name (report.py): its ids of the test text beside the folder tokenizer's, and
llama-perplexity's estimate beside the pipeline's own on those tokens. A language-modelling table, so its name lives
with the family rather than in pipeline/files/schema.py beside every stage's."""

LLAMA_CPP_TABLE = "llama_cpp.csv"
LLAMA_CPP_COLUMNS = ["model", "type", "gguf_mib", "tokens", "tokens_equal", "first_differing_token",
                     "perplexity_pipeline", "perplexity_llama_cpp", "not_measured_because"]
