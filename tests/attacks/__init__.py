"""The attacker's battery: each test does what an attacker would, from inside a sandbox or as
an API caller, and asserts the host did not follow (issue 29). One module per surface."""
