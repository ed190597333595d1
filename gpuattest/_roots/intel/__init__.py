"""Intel's SGX Root CA (it roots SGX and TDX quotes and their collateral), pinned by fingerprint."""
