"""fovi_lab inside other libraries.

    fovi   :func:`fovi_lab.integrations.fovi.register_with_fovi`: fovi_lab's backends in the ops registry of
           fovi's ``KNNConvLayer`` (``pip install "fovi-lab[fovi]"``, then ``pip install --no-deps fovi==2.4.0``)
           (its parts: ``fovi_registry``, ``fovi_networks``, ``fovi_layers``)
"""
