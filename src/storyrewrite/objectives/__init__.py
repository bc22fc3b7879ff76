"""Training objectives: the registry (`registry.py`: every objective by name, without its code) and
one module per objective family (`nll.py`, `cpo.py`, `dto.py`: the loss as a pure function of
tensors, and its builder). Nothing is imported here, so that importing the registry loads no
objective's code."""
