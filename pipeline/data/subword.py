"""A subword vocabulary for the models trained from scratch: translation (Marian) and language models (Llama).

No pretrained checkpoint is reachable offline, so the MT and LM experiments train small models, and those
need a vocabulary. For MT one BPE model is learned on both languages together, so the encoder and decoder
can share one embedding matrix (as Marian and Vaswani et al. 2017 do); for an LM, on the training texts.

- NFKC normalisation folds compatibility forms (ligatures, full-width letters, non-breaking spaces) so
  they do not waste vocabulary; case is kept, because BLEU is scored case-sensitively.
- A Metaspace pre-tokenizer turns each space into "▁" at the start of the following piece, so decoding
  restores the spaces exactly and detokenisation needs no language-specific rules.
- Special tokens have fixed ids, <pad>=0, </s>=1, <unk>=2: Marian uses the pad id as the decoder start
  token, and every encoded sentence ends in </s>. A language model's texts also start with </s>
  (`lead_eos`), as GPT-2's <|endoftext|> both ends one text and starts the next: the first piece is then
  predicted from a context, and no token is spent on a separate <s>.

The BPE trainer is deterministic for the same texts in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)  # ids 0, 1, 2, in this order


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, dest_dir: str | Path | None = None, min_frequency: int = 2,
    lead_eos: bool = False,
) -> PreTrainedTokenizerFast:
    """Learn a BPE vocabulary of `vocab_size` pieces (special tokens included) on `texts`.

    `texts` should hold the training sentences (MT: of both languages); never dev or test, whose pieces would
    otherwise leak into the vocabulary. `lead_eos`: every encoded text also starts with </s> (language models).
    If `dest_dir` is given, the tokenizer is saved there with
    `save_pretrained`, so `AutoTokenizer.from_pretrained(dest_dir)` gives it back.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens; got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if [tok.token_to_id(t) for t in SPECIAL_TOKENS] != [0, 1, 2]:
        raise AssertionError(f"special tokens got ids {[tok.token_to_id(t) for t in SPECIAL_TOKENS]}")
    eos_id = tok.token_to_id(EOS)
    # Marian-style: a source or target sentence is its pieces followed by </s>; no start token.
    lead = f"{EOS} " if lead_eos else ""
    tok.post_processor = processors.TemplateProcessing(
        single=f"{lead}$A {EOS}", pair=f"{lead}$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        **({"bos_token": EOS} if lead_eos else {}),  # MT tokenizers stay exactly as they were
        # The decoder already restores spaces; the default clean-up would also glue " ." and " '"
        # to the previous word, corrupting text that had those spaces.
        clean_up_tokenization_spaces=False,
    )
    if dest_dir is not None:
        tokenizer.save_pretrained(str(dest_dir))
    return tokenizer
