"""Reading inputs into records, writing outputs: readers, formats, the record schema, rejects, spools, the built-in corpus, manifests."""
