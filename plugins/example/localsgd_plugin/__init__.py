"""Example trainer-plugins plugin: a Local SGD strategy (``strategy="local_sgd"``)."""
