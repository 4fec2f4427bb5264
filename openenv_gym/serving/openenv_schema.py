"""The JSON schemas OpenEnv's ``GET /schema`` answers for an MCP-tool environment (openenv 0.10.0).

``CallToolAction``, ``CallToolObservation``, ``Observation`` (the reset observation) and ``State``,
as those pydantic models give them, written out here so that serving never imports OpenEnv (its
import loads its whole server stack, seconds); tests/serving checks them against the models.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMAS"]

SCHEMAS: dict[str, Any] = {'action': {'additionalProperties': False,
            'description': 'Call a specific tool via MCP.\n'
                           '\n'
                           "This action triggers MCP's tools/call operation with the\n"
                           'specified tool name and arguments.',
            'properties': {'metadata': {'additionalProperties': True,
                                        'description': 'Additional metadata for the action',
                                        'title': 'Metadata',
                                        'type': 'object'},
                           'type': {'const': 'call_tool',
                                    'default': 'call_tool',
                                    'description': 'Action type discriminator',
                                    'title': 'Type',
                                    'type': 'string'},
                           'tool_name': {'description': 'Name of the tool to call',
                                         'title': 'Tool Name',
                                         'type': 'string'},
                           'arguments': {'additionalProperties': True,
                                         'description': 'Arguments to pass to the tool',
                                         'title': 'Arguments',
                                         'type': 'object'}},
            'required': ['tool_name'],
            'title': 'CallToolAction',
            'type': 'object'},
 'observation': {'$defs': {'ToolError': {'additionalProperties': False,
                                         'description': 'Structured error for tool execution failures.\n'
                                                        '\n'
                                                        'This is used for transport/framework errors, NOT '
                                                        'for errors returned\n'
                                                        'by the tool itself (those go in the result field).',
                                         'properties': {'error_type': {'$ref': '#/$defs/ToolErrorType',
                                                                       'description': 'Category of the '
                                                                                      'error'},
                                                        'message': {'description': 'Human-readable error '
                                                                                   'message',
                                                                    'title': 'Message',
                                                                    'type': 'string'}},
                                         'required': ['error_type', 'message'],
                                         'title': 'ToolError',
                                         'type': 'object'},
                           'ToolErrorType': {'description': 'Types of errors that can occur during tool '
                                                            'execution.',
                                             'enum': ['execution_error',
                                                      'invalid_args',
                                                      'transport_error',
                                                      'tool_not_found',
                                                      'timeout'],
                                             'title': 'ToolErrorType',
                                             'type': 'string'}},
                 'additionalProperties': False,
                 'description': 'Response from tool execution.\n'
                                '\n'
                                "Contains the tool's result or an error if the call failed.\n"
                                'Tool-specific errors (from the tool itself) are included in the result.\n'
                                'Transport/framework errors use the error field.',
                 'properties': {'done': {'default': False,
                                         'description': 'Whether the episode has terminated',
                                         'title': 'Done',
                                         'type': 'boolean'},
                                'reward': {'anyOf': [{'type': 'boolean'},
                                                     {'type': 'integer'},
                                                     {'type': 'number'},
                                                     {'type': 'null'}],
                                           'default': None,
                                           'description': 'Reward signal from the last action',
                                           'title': 'Reward'},
                                'metadata': {'additionalProperties': True,
                                             'description': 'Additional metadata for the observation',
                                             'title': 'Metadata',
                                             'type': 'object'},
                                'tool_name': {'description': 'Name of the tool that was called',
                                              'title': 'Tool Name',
                                              'type': 'string'},
                                'result': {'default': None,
                                           'description': 'Tool-specific result (may include tool errors)',
                                           'title': 'Result'},
                                'error': {'anyOf': [{'$ref': '#/$defs/ToolError'}, {'type': 'null'}],
                                          'default': None,
                                          'description': 'Transport/framework error if call failed'}},
                 'required': ['tool_name'],
                 'title': 'CallToolObservation',
                 'type': 'object'},
 'reset_observation': {'additionalProperties': False,
                       'description': 'Base class for all environment observations.\n'
                                      '\n'
                                      'All observation subclasses should inherit from this base class.\n'
                                      'Uses Pydantic for automatic validation and serialization.',
                       'properties': {'done': {'default': False,
                                               'description': 'Whether the episode has terminated',
                                               'title': 'Done',
                                               'type': 'boolean'},
                                      'reward': {'anyOf': [{'type': 'boolean'},
                                                           {'type': 'integer'},
                                                           {'type': 'number'},
                                                           {'type': 'null'}],
                                                 'default': None,
                                                 'description': 'Reward signal from the last action',
                                                 'title': 'Reward'},
                                      'metadata': {'additionalProperties': True,
                                                   'description': 'Additional metadata for the observation',
                                                   'title': 'Metadata',
                                                   'type': 'object'}},
                       'title': 'Observation',
                       'type': 'object'},
 'state': {'additionalProperties': True,
           'description': 'Base class for environment state.\n'
                          '\n'
                          'Represents internal environment state, separate from observations.',
           'properties': {'episode_id': {'anyOf': [{'type': 'string'}, {'type': 'null'}],
                                         'default': None,
                                         'description': 'Unique identifier for the current episode',
                                         'title': 'Episode Id'},
                          'step_count': {'default': 0,
                                         'description': 'Number of steps taken in the current episode',
                                         'minimum': 0,
                                         'title': 'Step Count',
                                         'type': 'integer'}},
           'title': 'State',
           'type': 'object'}}
