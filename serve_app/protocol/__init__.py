"""Pure Responses-API logic: no Ray, no HTTP."""
