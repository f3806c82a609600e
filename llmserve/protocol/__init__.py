"""The words the roles share: what the platform reads from an OpenAI request and its error
bodies (openai_protocol), and what crosses the Router -> replica hop (replica_call). Plain data.
"""
