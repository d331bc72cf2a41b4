"""The `radixcache` command line. Thin: each command parses options, calls the library, and prints."""
