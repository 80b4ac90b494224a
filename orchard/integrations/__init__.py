"""Other harnesses' ways in to Orchard, on the SDK alone: ``harbor`` (Harbor's environment
provider, and what Harbor tasks need from a sandbox).

A layer just above ``orchard.env``: it imports the SDK and nothing else of orchard, so a tool
that loads one (Harbor imports its provider by path) needs only orchard's base install.
"""
