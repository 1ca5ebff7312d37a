"""beanstalkd: the beanstalkd 1.13 text protocol, server side (codec, events, names)."""
