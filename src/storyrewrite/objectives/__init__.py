"""Training objectives: what each is made of (`base.py`, with the NLL baseline's entry), the
registry (`registry.py`: every objective by name and the params section it reads, without its
code) and one module per objective family (`nll.py`, `cpo.py`, `dto.py`, `rloo.py`: the loss as a
pure function of tensors, and its builder). Nothing is imported here, so that importing the
registry loads no objective's code."""
