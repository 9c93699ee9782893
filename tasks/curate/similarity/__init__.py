"""Text similarity for curation and decontamination: normal forms and content hashes
(`normalize`), MinHash signatures (`minhash`) and LSH band buckets (`bands`), all
vectorised over a batch."""
