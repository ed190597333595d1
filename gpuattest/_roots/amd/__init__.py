"""AMD's SEV-SNP trust anchors (ARK and ASK per product line), pinned by fingerprint."""
