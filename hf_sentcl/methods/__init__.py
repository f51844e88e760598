"""The methods added in one folder each: a subpackage holds the method's config (the recipe keys it adds), its
trainer, its data hook and loss where it needs them, and, in its `__init__`, its registration `METHOD` (a
`hf_sentcl.registry.MethodSpec` with its paper). The registry finds every subpackage here by itself; a package
outside hf_sentcl adds a method the same way through the `hf_sentcl.methods` entry-point group (docs/extending.md)."""
