"""Special-token ids shared by every language.

Every SentencePiece model this project trains reserves the same ids (RoBERTa/fairseq order), so special
tokens line up across languages: embedding swaps and overlap initialisation rely on it.
"""

BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIAL_PIECES = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
SPECIAL_IDS = (BOS, PAD, EOS, UNK, MASK)
IGNORE_INDEX = -100  # label value for positions that carry no MLM/QA target
