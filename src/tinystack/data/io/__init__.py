"""Reading inputs into records, writing outputs.

Readers, formats, the record schema, rejects, spools, the built-in corpus, manifests.
"""
