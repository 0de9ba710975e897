"""The OpenAPI 3.1 document of the HTTP API, generated from the request contract.

`operations.py` declares each route once: only what is its own (summary, success answers,
the parameters and body it takes, the errors no rule derives). `build.py` turns a declaration
into an operation: parameters and request bodies from the contract's declarations
(`service/contract.py`), the path ids from the route template, and the error answers from
what the route does (`errors.py`). `components.py` holds the answer schemas and their examples;
`document.py` assembles the document and serves it.
"""
