"""Max-pool numerics (docs/numerics.md section 5): ``maxrule`` (the h_k rule of a monotone phi, one c at a time),
``levelsets`` (generalised order statistics of a non-monotone phi) and ``rules`` (which rule each pooled integral
takes). The quadrature of the max of k normals lives beside the Gaussian rules in numeric/quadrature.py."""
