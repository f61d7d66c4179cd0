"""evaluation: the scorers (``bleu``: sacreBLEU and the paper's tokenized BLEU; ``evalb``:
EVALB's labelled brackets) and the registry's champion policy (``champion``)."""
