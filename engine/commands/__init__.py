"""Operator commands (`engine destinations …`, `engine send`, `engine deliveries …`,
`engine replay …`) and the friendly errors every command shares.

The commands are clients of the HTTP API's own handlers, called in this process (see
local_api.py): the validation, the SSRF policy and the SQL are the API's, not a copy.
"""
