// model module: config, weights, forward pass.
