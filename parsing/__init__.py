"""parsing: Penn Treebank trees (``trees``) and the tree <-> token sequence forms (``linearize``)
of the constituency-parsing transfer task (paper section 6.3)."""
