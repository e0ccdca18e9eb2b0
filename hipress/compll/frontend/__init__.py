"""The CompLL front end: source text -> parse tree -> AST -> checked program (IR)."""
