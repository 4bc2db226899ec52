"""The LLM side: the httpx client, classification of its exceptions and answers, repair prompts, and the
guarded caller (the core's guards wired around the client)."""
