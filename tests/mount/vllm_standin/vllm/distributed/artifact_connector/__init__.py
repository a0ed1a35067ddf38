# SPDX-License-Identifier: Apache-2.0
"""Stand-in of vLLM's artifact connector package; like vLLM's, importing it
imports the connector."""
from vllm.distributed.artifact_connector.connector import (
    ArtifactSchedulerConnector,
    ArtifactWorkerConnector,
)
from vllm.distributed.artifact_connector.protocol import (
    ArtifactConnectorMetadata,
    ArtifactConnectorOutput,
)

__all__ = ["ArtifactConnectorMetadata", "ArtifactConnectorOutput",
           "ArtifactSchedulerConnector", "ArtifactWorkerConnector"]
