"""The CFSL protocol: the task specification, the sampler, the episode walk and the metrics."""
