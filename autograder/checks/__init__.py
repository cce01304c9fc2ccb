"""Hidden-test checks, one module per notebook. Hidden test cells call these."""
