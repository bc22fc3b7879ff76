"""Results report: the paper-style table (Markdown and LaTeX), significance marks, examples."""
