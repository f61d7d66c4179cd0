"""The ids every vocabulary of ours gives its special symbols: the model, the tokenizers and the
shards agree on them (a module of its own, so that what reads only them does not count the model's
config as its code)."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
