"""The `tracestore` command line: thin verbs over the same services as the API."""
